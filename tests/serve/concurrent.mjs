// concurrent.mjs URL KEY N_CLIENTS MAX_TOKENS: N prompts answered one at a
// time (greedy), then all at once as streams through the openai client:
// every client must get exactly its own solo answer. Prints one JSON object.
import { loadOpenAI } from './openai.mjs';

const [url, key, nClients, n] = process.argv.slice(2);
const OpenAI = await loadOpenAI();
const client = new OpenAI({ baseURL: url, apiKey: key, maxRetries: 0, timeout: 300000 });
const max_tokens = Number(n);
const topics = ['The Linux kernel', 'A file system', 'The scheduler', 'Memory management', 'Device drivers',
                'The network stack', 'Interrupt handling', 'The page cache', 'Kernel modules', 'System calls',
                'The virtual file system', 'Locking primitives', 'Power management', 'The block layer',
                'Process creation', 'Signals'];
const prompts = Array.from({ length: Number(nClients) }, (_, i) => topics[i % topics.length] + (i >= topics.length ? ` (${i})` : ''));

const solo = [];
for (const prompt of prompts) {
  const c = await client.completions.create({ model: 'doc', prompt, max_tokens, temperature: 0 });
  solo.push(c.choices[0].text);
}
async function streamed(prompt) {
  let text = '';
  const s = await client.completions.create({ model: 'doc', prompt, max_tokens, temperature: 0, stream: true });
  for await (const ch of s) for (const c of ch.choices) text += c.text;
  return text;
}
const together = await Promise.all(prompts.map(streamed));
const mismatches = [];
prompts.forEach((p, i) => { if (together[i] !== solo[i]) mismatches.push({ prompt: p, solo: solo[i], together: together[i] }); });
const distinct = new Set(solo).size;
console.log(JSON.stringify({ clients: prompts.length, distinct, mismatches, solo }));
