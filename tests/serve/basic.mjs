// basic.mjs URL KEY PROMPT N MESSAGES_JSON: the openai client against
// `spectra serve`: completions and chat completions, whole and streamed
// (greedy), printed as one JSON object for tests/test_serve.c to compare
// with `spectra run`.
import { loadOpenAI } from './openai.mjs';

const [url, key, prompt, n, messagesJson] = process.argv.slice(2);
const OpenAI = await loadOpenAI();
const client = new OpenAI({ baseURL: url, apiKey: key, maxRetries: 0, timeout: 120000 });
const max_tokens = Number(n);
const messages = JSON.parse(messagesJson);
const out = {};

// each part on its own: a failure is recorded as NAME_error and the rest still runs
async function part(name, fn) {
  try { await fn(); } catch (e) { out[`${name}_error`] = `${e.status ?? ''} ${e.message}`; }
}

await part('completion', async () => {
const c = await client.completions.create({ model: 'doc', prompt, max_tokens, temperature: 0 });
out.completion = c.choices[0].text;
out.completion_finish = c.choices[0].finish_reason;
out.completion_usage = c.usage;
});

await part('completion_stream', async () => {
let text = '', finish = null, usage = null, chunks = 0;
const cs = await client.completions.create({ model: 'doc', prompt, max_tokens, temperature: 0, stream: true,
                                            stream_options: { include_usage: true } });
for await (const ch of cs) {
  chunks++;
  if (ch.usage) usage = ch.usage;
  for (const choice of ch.choices) {
    text += choice.text;
    if (choice.finish_reason) finish = choice.finish_reason;
  }
}
out.completion_stream = text;
out.completion_stream_finish = finish;
out.completion_stream_usage = usage;
out.completion_stream_chunks = chunks;
});

await part('chat', async () => {
const r = await client.chat.completions.create({ model: 'doc', messages, max_tokens, temperature: 0 });
out.chat = r.choices[0].message.content;
out.chat_role = r.choices[0].message.role;
out.chat_finish = r.choices[0].finish_reason;
out.chat_usage = r.usage;
});

await part('chat_stream', async () => {
let text = '', finish = null, role = null;
const rs = await client.chat.completions.create({ model: 'doc', messages, max_tokens, temperature: 0, stream: true });
for await (const ch of rs) {
  const d = ch.choices[0]?.delta ?? {};
  if (d.role && role === null) role = d.role;
  if (d.content) text += d.content;
  if (ch.choices[0]?.finish_reason) finish = ch.choices[0].finish_reason;
}
out.chat_stream = text;
out.chat_stream_role = role;
out.chat_stream_finish = finish;
});

await part('models', async () => {
const models = await client.models.list();
out.models = models.data.map((m) => m.id);
});

// an error object through the client: n = 2
try {
  await client.completions.create({ model: 'doc', prompt, max_tokens: 2, n: 2 });
  out.n2 = 'accepted';
} catch (e) {
  out.n2 = { status: e.status, message: e.message };
}
console.log(JSON.stringify(out));
