"""A running stream's longest gap while an 8,000-token prompt is prefilled (issue 49 goal: <= 250 ms)."""
import json, subprocess, sys, time, threading, httpx, os
port = 8791
env = dict(os.environ)
srv = subprocess.Popen([sys.executable, "-m", "specdecode.cli", "serve", "--target", "smollm2-135m-instruct",
                        "--port", str(port)], stdout=open("/work/lab49/gap_server.log", "w"), stderr=subprocess.STDOUT, env=env)
url = f"http://127.0.0.1:{port}"
try:
    for _ in range(600):
        try:
            if httpx.get(url + "/health", timeout=2).json().get("status") == "ok": break
        except Exception: pass
        time.sleep(0.5)
    time.sleep(float(sys.argv[1]) if len(sys.argv) > 1 else 20)  # idle preparation of the other drafters
    gaps = []; marks = {}
    def stream():
        last = None
        with httpx.stream("POST", url + "/v1/completions", json={"model": "smollm2-135m-instruct", "prompt": "def f(x):",
                          "max_tokens": 1500, "temperature": 0, "stream": True, "ignore_eos": True, "drafter": "none"}, timeout=300) as r:
            for line in r.iter_lines():
                now = time.perf_counter()
                if line.startswith("data:"):
                    if last is not None: gaps.append((now - last, now))
                    last = now
    t = threading.Thread(target=stream); t.start()
    time.sleep(2.0)
    words = ("alpha beta gamma delta " * int(sys.argv[2]))
    marks["long_sent"] = time.perf_counter()
    r = httpx.post(url + "/v1/completions", json={"model": "smollm2-135m-instruct", "prompt": words, "max_tokens": 4,
                   "temperature": 0}, timeout=600)
    marks["long_done"] = time.perf_counter()
    print("long request", r.status_code, r.json().get("usage") or r.text[:300])
    t.join()
    during = [g for g, at in gaps if marks["long_sent"] <= at <= marks["long_done"] + 0.5]
    before = [g for g, at in gaps if at < marks["long_sent"]]
    print(f"long prompt took {marks['long_done'] - marks['long_sent']:.1f} s; stream gaps before: median "
          f"{sorted(before)[len(before)//2]*1000:.0f} ms, max {max(before)*1000:.0f} ms; during: {len(during)} events, max {max(during)*1000:.0f} ms")
finally:
    srv.terminate(); srv.wait()
