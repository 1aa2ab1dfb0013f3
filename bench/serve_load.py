#!/usr/bin/env python3
"""serve_load.py: load test of `spectra serve` (a benchmark, not a test:
it prints a markdown table). Python's standard library only, so it runs
wherever the server does (the GPU machine has no Node).

For each client count C (default 1,4,16,64) it sends R streamed greedy
/v1/completions requests in all, C at a time, and reports the total
generated tokens/s, time to first token and inter-token latency
(p50/p90/p99), failed responses (not 200, no [DONE], an error event),
mixed ones (the solo answer of another prompt: requests crossed) and
diverged ones (text other than the solo answer of the same prompt, taken
before the load, and not another's), with the share of the solo answer
they keep before they diverge, and the server's RSS at the start and end
of each level (flat across many requests = no leak). On the CPU a batch
row is bit-identical to a step alone, so diverged must be 0 there; on a
GPU the batched product rounds differently from the one-token GEMV, and
greedy decoding flips at near ties (frequent with random weights).

  bench/serve_load.py --spectra build/spectra --model m.trdc [--parallel 4] [--threads 2]
       [--backend cpu|cuda] [--ctx N] [--clients 1,4,16,64] [--requests 1000] [--max-tokens 32] [--out results.md]
  bench/serve_load.py --url http://127.0.0.1:8080 --pid PID ...   (a server already running)
"""
import argparse
import http.client
import json
import re
import subprocess
import sys
import threading
import time
import urllib.parse

PROMPTS = ['The Linux kernel', 'A file system', 'The scheduler', 'Memory management', 'Device drivers',
           'The network stack', 'Interrupt handling', 'The page cache', 'Kernel modules', 'System calls',
           'The virtual file system', 'Locking primitives', 'Power management', 'The block layer',
           'Process creation', 'Signals']


def rss_mib(pid):
    try:
        with open(f'/proc/{pid}/status') as f:
            m = re.search(r'VmRSS:\s+(\d+)', f.read())
        return int(m.group(1)) / 1024 if m else float('nan')
    except OSError:
        return float('nan')


def one(host, port, prompt, max_tokens):
    """One streamed request: (ok, text, content chunk times, t0, completion tokens)."""
    t0 = time.perf_counter()
    times, text, ok, tokens = [], '', False, 0
    try:
        c = http.client.HTTPConnection(host, port, timeout=600)
        body = json.dumps({'prompt': prompt, 'max_tokens': max_tokens, 'temperature': 0, 'stream': True,
                           'stream_options': {'include_usage': True}})
        c.request('POST', '/v1/completions', body, {'Content-Type': 'application/json'})
        r = c.getresponse()
        if r.status != 200:
            r.read()
            c.close()
            return False, text, times, t0, tokens
        buf = b''
        while True:
            part = r.read1(65536)
            if not part:
                break
            buf += part
            while b'\n\n' in buf:
                ev, buf = buf.split(b'\n\n', 1)
                if not ev.startswith(b'data: '):
                    continue
                data = ev[6:]
                if data == b'[DONE]':
                    ok = True
                    continue
                j = json.loads(data)
                if 'error' in j:
                    ok = False
                    continue
                if j.get('usage'):
                    tokens = j['usage']['completion_tokens']
                ch = j.get('choices') or []
                t = ch[0].get('text') if ch else None
                if t:
                    text += t
                    times.append(time.perf_counter())
        c.close()
    except (OSError, http.client.HTTPException, ValueError):
        ok = False
    return ok, text, times, t0, tokens


def pct(a, p):
    if not a:
        return float('nan')
    s = sorted(a)
    return s[min(len(s) - 1, int(p / 100 * len(s)))]


def f1(x):
    return '-' if x != x else f'{x:.1f}'


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument('--spectra')
    ap.add_argument('--model')
    ap.add_argument('--url')
    ap.add_argument('--pid', type=int)
    ap.add_argument('--parallel', type=int, default=4)
    ap.add_argument('--threads')
    ap.add_argument('--backend')
    ap.add_argument('--ctx')
    ap.add_argument('--clients', default='1,4,16,64')
    ap.add_argument('--requests', type=int, default=1000)
    ap.add_argument('--max-tokens', type=int, default=32)
    ap.add_argument('--out')
    a = ap.parse_args()
    clients = [int(x) for x in a.clients.split(',')]
    server, pid, url = None, a.pid, a.url
    if not url:
        if not a.spectra or not a.model:
            sys.exit('give --spectra BIN --model MODEL (the script starts the server) or --url URL --pid PID')
        sargs = [a.spectra, 'serve', '-m', a.model, '--port', '0', '--parallel', str(a.parallel), '-q',
                 '--queue', str(max(64, *clients))]
        for flag, v in (('--threads', a.threads), ('--backend', a.backend), ('--ctx', a.ctx)):
            if v:
                sargs += [flag, v]
        server = subprocess.Popen(sargs, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        pid = server.pid
        seen = ''
        while True:  # the start line names the URL
            line = server.stderr.readline()
            if not line:
                sys.exit(f'spectra serve exited {server.wait()}: {seen}')
            seen += line
            m = re.search(r'(http://\S+?)(?=/v1)', line)
            if m:
                url = m.group(1)
                break
        threading.Thread(target=lambda: server.stderr.read(), daemon=True).start()  # keep the pipe drained
    u = urllib.parse.urlparse(url)
    host, port = u.hostname, u.port
    solo = {p: one(host, port, p, a.max_tokens)[1] for p in PROMPTS}
    rows = []
    for C in clients:
        rss0 = rss_mib(pid)
        lock = threading.Lock()
        st = {'next': 0, 'failed': 0, 'mixed': 0, 'diverged': 0, 'kept': [], 'tokens': 0, 'ttft': [], 'itl': []}

        def worker():
            while True:
                with lock:
                    i = st['next']
                    st['next'] += 1
                if i >= a.requests:
                    return
                p = PROMPTS[i % len(PROMPTS)]
                ok, text, times, t0, tokens = one(host, port, p, a.max_tokens)
                with lock:
                    if not ok:
                        st['failed'] += 1
                        continue
                    if text != solo[p]:
                        if any(text == v for q, v in solo.items() if q != p):
                            st['mixed'] += 1
                        else:
                            st['diverged'] += 1
                            k = 0
                            while k < min(len(text), len(solo[p])) and text[k] == solo[p][k]:
                                k += 1
                            st['kept'].append(k / max(1, len(solo[p])))
                    st['tokens'] += tokens
                    if times:
                        st['ttft'].append((times[0] - t0) * 1000)
                    st['itl'] += [(times[k] - times[k - 1]) * 1000 for k in range(1, len(times))]

        t0 = time.perf_counter()
        ths = [threading.Thread(target=worker) for _ in range(C)]
        for t in ths:
            t.start()
        for t in ths:
            t.join()
        secs = time.perf_counter() - t0
        row = dict(C=C, secs=secs, tps=st['tokens'] / secs, rss0=rss0, rss1=rss_mib(pid), **st)
        rows.append(row)
        print(f"clients {C}: {f1(row['tps'])} tokens/s, ttft p50 {f1(pct(st['ttft'], 50))} ms, "
              f"failed {st['failed']}, mixed {st['mixed']}, diverged {st['diverged']}", file=sys.stderr)
    md = ('| clients | requests | seconds | tokens/s (all) | TTFT p50 / p90 / p99 (ms) | ITL p50 / p90 / p99 (ms) '
          '| failed | mixed | diverged (solo text kept, median) | RSS start / end (MiB) |\n'
          '| ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |\n')
    for r in rows:
        md += (f"| {r['C']} | {a.requests} | {f1(r['secs'])} | {f1(r['tps'])} | "
               f"{f1(pct(r['ttft'], 50))} / {f1(pct(r['ttft'], 90))} / {f1(pct(r['ttft'], 99))} | "
               f"{f1(pct(r['itl'], 50))} / {f1(pct(r['itl'], 90))} / {f1(pct(r['itl'], 99))} | "
               f"{r['failed']} | {r['mixed']} | {r['diverged']}"
               f"{' (%.0f %%)' % (100 * pct(r['kept'], 50)) if r['kept'] else ''} | {f1(r['rss0'])} / {f1(r['rss1'])} |\n")
    md += (f"\nmax_tokens {a.max_tokens}, greedy, {len(PROMPTS)} distinct prompts, server --parallel "
           f"{'?' if a.url else a.parallel}{', --threads ' + a.threads if a.threads else ''}"
           f"{', --backend ' + a.backend if a.backend else ''}\n")
    print(md)
    if a.out:
        with open(a.out, 'w') as f:
            f.write(md)
    if server:
        server.terminate()
        server.wait()


if __name__ == '__main__':
    main()
