#!/usr/bin/env node
// serve_load.mjs: load test of `spectra serve` (not a test: it prints a
// markdown table). For each client count C (default 1,4,16,64) it sends R
// streamed greedy /v1/completions requests in all, C at a time, and
// reports the total generated tokens/s, time to first token and
// inter-token latency (p50/p90/p99), failed responses (not 200, no
// [DONE], an error event) and mixed ones (text other than the solo answer
// for the same prompt, taken before the load), and the server's RSS at the
// start and end of each level (flat across many requests = no leak).
//
//   node bench/serve_load.mjs --spectra build/spectra --model m.trdc [--parallel 4] [--threads 2]
//        [--clients 1,4,16,64] [--requests 1000] [--max-tokens 32] [--out results.md]
//   node bench/serve_load.mjs --url http://127.0.0.1:8080 --pid PID ...   (a server already running)
//
// Uses only Node's own fetch (Node >= 18).
import { spawn } from 'node:child_process';
import { readFileSync, writeFileSync } from 'node:fs';
import { performance } from 'node:perf_hooks';

const args = Object.fromEntries(process.argv.slice(2).reduce((acc, a, i, all) => {
  if (a.startsWith('--')) acc.push([a.slice(2), all[i + 1] && !all[i + 1].startsWith('--') ? all[i + 1] : 'true']);
  return acc;
}, []));
const clientsList = (args.clients || '1,4,16,64').split(',').map(Number);
const total = Number(args.requests || 1000);
const maxTokens = Number(args['max-tokens'] || 32);
const parallel = Number(args.parallel || 4);
const threads = args.threads || '';

let url = args.url, pid = args.pid ? Number(args.pid) : null, server = null;
if (!url) {
  if (!args.spectra || !args.model) {
    console.error('give --spectra BIN --model MODEL (the script starts the server) or --url URL --pid PID');
    process.exit(2);
  }
  const sargs = ['serve', '-m', args.model, '--port', '0', '--parallel', String(parallel), '-q',
                 '--queue', String(Math.max(64, ...clientsList))];
  if (threads) sargs.push('--threads', threads);
  server = spawn(args.spectra, sargs, { stdio: ['ignore', 'ignore', 'pipe'] });
  pid = server.pid;
  url = await new Promise((resolve, reject) => {
    let buf = '';
    server.stderr.on('data', (d) => {
      buf += d;
      const m = buf.match(/http:\/\/\S+?(?=\/v1)/);
      if (m) resolve(m[0]);
    });
    server.on('exit', (c) => reject(new Error(`spectra serve exited ${c}: ${buf}`)));
  });
}

function rssMiB() {
  try {
    const m = readFileSync(`/proc/${pid}/status`, 'utf8').match(/VmRSS:\s+(\d+)/);
    return m ? Number(m[1]) / 1024 : NaN;
  } catch { return NaN; }
}

const prompts = ['The Linux kernel', 'A file system', 'The scheduler', 'Memory management', 'Device drivers',
  'The network stack', 'Interrupt handling', 'The page cache', 'Kernel modules', 'System calls',
  'The virtual file system', 'Locking primitives', 'Power management', 'The block layer', 'Process creation',
  'Signals'];

// One streamed request: its text, times of the content chunks, tokens, ok.
async function one(prompt) {
  const t0 = performance.now();
  const times = [];
  let text = '', ok = false, tokens = 0;
  try {
    const r = await fetch(`${url}/v1/completions`, {
      method: 'POST', headers: { 'Content-Type': 'application/json' },
      body: JSON.stringify({ prompt, max_tokens: maxTokens, temperature: 0, stream: true,
                             stream_options: { include_usage: true } }),
    });
    if (r.status !== 200) { await r.text(); return { ok: false, text, times, t0, tokens }; }
    const dec = new TextDecoder();
    let buf = '';
    for await (const part of r.body) {
      buf += dec.decode(part, { stream: true });
      let k;
      while ((k = buf.indexOf('\n\n')) >= 0) {
        const ev = buf.slice(0, k);
        buf = buf.slice(k + 2);
        if (!ev.startsWith('data: ')) continue;
        const data = ev.slice(6);
        if (data === '[DONE]') { ok = true; continue; }
        const j = JSON.parse(data);
        if (j.error) { ok = false; continue; }
        if (j.usage) tokens = j.usage.completion_tokens;
        const t = j.choices?.[0]?.text;
        if (t) { text += t; times.push(performance.now()); }
      }
    }
  } catch (e) {
    ok = false;
  }
  return { ok, text, times, t0, tokens };
}

const pct = (a, p) => {
  if (!a.length) return NaN;
  const s = [...a].sort((x, y) => x - y);
  return s[Math.min(s.length - 1, Math.floor((p / 100) * s.length))];
};
const f1 = (x) => (Number.isFinite(x) ? x.toFixed(1) : '-');

// the solo answers
const solo = {};
for (const p of prompts) solo[p] = (await one(p)).text;

const rows = [];
for (const C of clientsList) {
  const rss0 = rssMiB();
  let next = 0, failed = 0, mixed = 0, tokens = 0;
  const ttft = [], itl = [];
  const t0 = performance.now();
  async function worker() {
    for (;;) {
      const i = next++;
      if (i >= total) return;
      const p = prompts[i % prompts.length];
      const r = await one(p);
      if (!r.ok) { failed++; continue; }
      if (r.text !== solo[p]) mixed++;
      tokens += r.tokens;
      if (r.times.length) ttft.push(r.times[0] - r.t0);
      for (let k = 1; k < r.times.length; k++) itl.push(r.times[k] - r.times[k - 1]);
    }
  }
  await Promise.all(Array.from({ length: C }, worker));
  const secs = (performance.now() - t0) / 1000;
  const row = { C, requests: total, secs, tps: tokens / secs, ttft, itl, failed, mixed, rss0, rss1: rssMiB() };
  rows.push(row);
  console.error(`clients ${C}: ${f1(row.tps)} tokens/s, ttft p50 ${f1(pct(ttft, 50))} ms, failed ${failed}, mixed ${mixed}`);
}

let md = `| clients | requests | seconds | tokens/s (all) | TTFT p50 / p90 / p99 (ms) | ITL p50 / p90 / p99 (ms) | failed | mixed | RSS start / end (MiB) |\n`;
md += `| ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |\n`;
for (const r of rows)
  md += `| ${r.C} | ${r.requests} | ${f1(r.secs)} | ${f1(r.tps)} | ${f1(pct(r.ttft, 50))} / ${f1(pct(r.ttft, 90))} / ${f1(pct(r.ttft, 99))} | ` +
        `${f1(pct(r.itl, 50))} / ${f1(pct(r.itl, 90))} / ${f1(pct(r.itl, 99))} | ${r.failed} | ${r.mixed} | ${f1(r.rss0)} / ${f1(r.rss1)} |\n`;
md += `\nmax_tokens ${maxTokens}, greedy, ${prompts.length} distinct prompts, server --parallel ${args.url ? '?' : parallel}` +
      `${threads ? `, --threads ${threads}` : ''}\n`;
console.log(md);
if (args.out) writeFileSync(args.out, md);
if (server) {
  server.kill('SIGTERM');
  await new Promise((r) => server.on('exit', r));
}
