"""Checks for labs/07_llm_inference_lab.ipynb (lesson 07: a KV cache and a continuous-batching scheduler).

The learner writes two things: generate_with_cache(model, prompt, n_new), the reference greedy loop with a KV cache,
and schedule_continuous(engine, trace), the iteration-level scheduler loop over the provided llm.Engine. The checks
compare tokens with the reference model, and time the learner's code against the reference in the same run.
"""

from __future__ import annotations

import torch

from utils import llm
from utils.checks import LabCheckFailed, call, expect, figure, passed

MIN_KV_SPEEDUP = 1.2  # per-token, at the longest position; the lesson measures several times more
MIN_BATCHING_GAIN = 1.2  # continuous over static throughput; the lesson measures about 2x


def lab_model(smoke: bool):
    """(model, tokenizer): the lesson's TinyGPT (its cached weights when lesson 07 ran in the same mode)."""
    return llm.tiny_gpt(10 if smoke else 300)


def _prompts(tok):
    text = llm.corpus_text()
    return {
        "one prompt of 9 tokens": tok.encode(text[:9])[None],
        "a batch of 3 prompts": torch.stack([tok.encode(text[i : i + 14]) for i in (0, 200, 4000)]),
        "a one-token prompt": tok.encode(text[50:51])[None],
    }


def untrained_twin(model):
    """A TinyGPT of the same sizes with seeded random weights. Its greedy tokens change with every context, so a
    cache read at a wrong position or a wrong mask changes them; a briefly trained model (smoke mode's 10 steps)
    predicts one token everywhere and cannot tell."""
    torch.manual_seed(0)
    return llm.TinyGPT(model.cfg).eval()


def check_kv_cache(generate_with_cache, model, tok, max_len: int = 256, rounds: int = 2) -> float:
    """Same greedy tokens as llm.generate, on the lab's model and on its untrained twin (whose tokens depend on the
    context); then the per-token time at the longest position, against llm.generate."""
    for label, m in (("lab model", model), ("untrained twin", untrained_twin(model))):
        for name, prompt in _prompts(tok).items():
            for n_new in (1, 25):
                want = llm.generate(m, prompt, n_new)
                got = call(generate_with_cache, m, prompt, n_new, what="generate_with_cache(model, prompt, n_new)")
                expect(isinstance(got, torch.Tensor),
                       f"generate_with_cache should return a tensor of new tokens, got {type(got).__name__}")
                expect(tuple(got.shape) == tuple(want.shape),
                       f"{label}, {name}, n_new={n_new}: expected new tokens of shape {tuple(want.shape)} (batch, "
                       f"n_new), got {tuple(got.shape)}. Return only the generated tokens, not the prompt.")
                if not torch.equal(got.cpu(), want):
                    step = int((got.cpu() != want).any(dim=0).nonzero()[0])
                    raise LabCheckFailed(
                        f"{label}, {name}, n_new={n_new}: your tokens differ from the reference from step {step} on. "
                        "Step 0 comes from the prompt's prefill alone; every later step reads the cache. A first "
                        "difference at step 0 points at the prefill, one at a later step at what a decode step sees: "
                        "compare its positions, the cache length and the mask with the uncached loop's at that step.")
    prompt = _prompts(tok)["one prompt of 9 tokens"][:, :8]
    n_steps = max_len - prompt.shape[1]
    runs = {"reference": [], "yours": []}
    for _ in range(rounds):
        for name, fn in (("reference", llm.generate), ("yours", generate_with_cache)):
            _, times = llm.step_times(model, lambda fn=fn: fn(model, prompt, n_steps))
            expect(len(times) == n_steps,
                   f"{name}: the model's output layer ran {len(times)} times for {n_steps} new tokens; each step "
                   "should call model.logits (once) on the newest position")
            runs[name].append(times)
    last = {name: float(torch.tensor(r).min(dim=0).values[-8:].median()) for name, r in runs.items()}
    speedup = last["reference"] / last["yours"]
    print(f"  per-token time at position ~{max_len}: reference {last['reference'] * 1e3:.2f} ms, yours "
          f"{last['yours'] * 1e3:.2f} ms")
    expect(speedup >= MIN_KV_SPEEDUP,
           f"your loop is {speedup:.2f}x the reference per token at position ~{max_len} (needs >= {MIN_KV_SPEEDUP}x): "
           "each decode step should run only the newest token through the model, not the whole sequence")
    passed("KV cache", f"identical greedy tokens on {len(_prompts(tok))} prompt sets, trained and untrained weights; {speedup:.1f}x faster per token "
           f"than the uncached loop at position ~{max_len}, measured side by side")
    figure("kv_cache_speedup", speedup, "x")
    return speedup


def lab_trace(model, tok, n: int, max_batch: int) -> list[llm.Request]:
    """The lab's arrival trace: faster than either scheduler can serve (rate set from a measured decode step)."""
    step_s = llm.decode_step_seconds(model, max_batch)
    capacity = max_batch / (41 * step_s)
    return llm.make_trace(tok, n, rate=2 * capacity, mean_new=40, max_new=192, seed=8)


def check_scheduler(schedule_continuous, model, tok, n_requests: int = 64, max_batch: int = 8, rounds: int = 2):
    """Every request finishes with the reference model's greedy tokens; throughput beats llm.run_static."""
    trace = lab_trace(model, tok, n_requests, max_batch)
    best = {}
    for _ in range(rounds):
        for name, schedule in (("static", llm.run_static), ("yours", schedule_continuous)):
            engine = llm.Engine(model, max_batch, max_len=256)
            requests = llm.fresh(trace)
            call(schedule, engine, requests, what="schedule_continuous(engine, trace)")
            unfinished = [r.id for r in requests if not r.done]
            expect(not unfinished, f"{name}: requests {unfinished[:8]} did not get all their tokens (each needs "
                                   "max_new); keep looping while any request is pending, waiting or running")
            expect(not engine.slot_request,
                   f"{name}: slots {sorted(engine.slot_request)} were never released: release() a slot when its "
                   "request is done")
            wrong = {r.id: n for r in requests if (n := llm.verify_greedy(model, r.prompt, r.output))}
            expect(not wrong, f"{name}: requests {list(wrong)[:8]} hold tokens that are not the model's greedy choice")
            stats = llm.summarize(requests, engine)
            if name not in best or stats["throughput_tok_s"] > best[name]["throughput_tok_s"]:
                best[name] = stats
    for name, s in best.items():
        print(f"  {name:7s} {s['throughput_tok_s']:7.0f} tokens/s, TTFT p50 {s['ttft_p50_s'] * 1e3:6.1f} ms, "
              f"{s['decode_steps']} decode steps, mean batch {s['mean_batch']:.1f}, {s['wasted_fraction']:.0%} wasted")
    gain = best["yours"]["throughput_tok_s"] / best["static"]["throughput_tok_s"]
    yours, static = best["yours"], best["static"]
    expect(gain >= MIN_BATCHING_GAIN,
           f"your scheduler serves {gain:.2f}x static batching's throughput (needs >= {MIN_BATCHING_GAIN}x): it ran "
           f"{yours['decode_steps']} decode steps with a mean batch of {yours['mean_batch']:.1f} and "
           f"{yours['wasted_fraction']:.0%} of its slot-steps wasted, against static's {static['decode_steps']} steps, "
           f"{static['mean_batch']:.1f} and {static['wasted_fraction']:.0%}. How full is each of your steps, and how "
           "many steps does a waiting request wait for a slot?")
    passed("continuous batching", f"{len(trace)} requests served with the right tokens; {gain:.2f}x the throughput of "
           "static batching on the same engine and trace")
    figure("throughput_over_static", gain, "x")
    return gain
