"""Measure structured-generation libraries on the default model's 49k vocabulary.

For llguidance, xgrammar and outlines-core: the one-time tokenizer preparation, the per-request
grammar compile of a tool-call JSON schema, and the per-token cost of computing the mask,
applying it to a logits row (``mx.where``, the way ``router.worker.decoding.constrain`` does) and
advancing the matcher. Tokens are picked greedily from fixed random logits under the mask, so
each library walks a valid document of its own grammar. Whitespace between JSON tokens is
fixed (llguidance ``whitespace_flexible: False``, xgrammar ``any_whitespace=False``, outlines'
default pattern): with free whitespace a small model can loop on blanks until max_tokens.

    PYTHONPATH=$PWD nice -n 10 python examples/bench_constraints.py [--out FILE]

xgrammar's wheel imports torch (and pulls CUDA wheels, several GB) at import time; its grammar
engine does not need it. To measure it without installing torch, put xgrammar and
apache-tvm-ffi in a directory with ``pip install --no-deps --target DIR`` and a stub ``torch``
package on PYTHONPATH (``--xgrammar-path DIR:STUBDIR``).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "name": {"const": "get_weather"},
        "arguments": {
            "type": "object",
            "properties": {
                "city": {"type": "string", "maxLength": 40},
                "unit": {"enum": ["celsius", "fahrenheit"]},
                "days": {"type": "integer", "minimum": 1, "maximum": 14},
            },
            "required": ["city", "unit"],
            "additionalProperties": False,
        },
    },
    "required": ["name", "arguments"],
    "additionalProperties": False,
}
MAX_STEPS = 120


def apply_mask(logits: Any, bitmask: np.ndarray, vocab: int) -> Any:
    import mlx.core as mx

    allowed = np.unpackbits(bitmask.view(np.uint8), bitorder="little")[:vocab]
    return mx.where(mx.array(allowed.astype(bool)), logits, -mx.inf)


REPEATS = 5  # walks per library; medians over all their tokens (the machine is noisy)


def walk(
    mask_into: Callable[[np.ndarray], None],
    advance: Callable[[int], None],
    done: Callable[[], bool],
    reset: Callable[[], None],
    vocab: int,
    eos: int,
    walked: list[int],
) -> list[tuple[float, float]]:
    """Per token (library seconds: mask + advance, total seconds: also apply and pick),
    greedy over fixed random logits, ``REPEATS`` walks from a reset matcher."""
    import mlx.core as mx

    bitmask = np.zeros((vocab + 31) // 32, dtype=np.int32)
    times = []
    for repeat in range(REPEATS):
        reset()
        rng = np.random.default_rng(0)
        for _ in range(MAX_STEPS):
            logits = mx.array(rng.standard_normal(vocab).astype(np.float32))
            mx.eval(logits)
            t0 = time.perf_counter()
            mask_into(bitmask)
            t1 = time.perf_counter()
            token = int(mx.argmax(apply_mask(logits, bitmask, vocab)).item())
            t2 = time.perf_counter()
            if token == eos or done():
                times.append((t1 - t0, t2 - t0))
                break
            advance(token)
            t3 = time.perf_counter()
            if repeat == 0:
                walked.append(token)
            times.append((t1 - t0 + t3 - t2, t3 - t0))
    return times


def bench_llguidance(tokenizer: Any, vocab: int, eos: int) -> dict[str, Any]:
    import llguidance

    t0 = time.perf_counter()
    lltok = llguidance.LLTokenizer(
        tokenizer._tokenizer.backend_tokenizer.to_str(), n_vocab=vocab, eos_token=eos
    )
    prep = time.perf_counter() - t0
    t0 = time.perf_counter()
    grammar = llguidance.LLMatcher.grammar_from_json_schema(
        SCHEMA, overrides={"whitespace_flexible": False}
    )
    matcher = llguidance.LLMatcher(lltok, grammar)
    matcher.compute_bitmask()  # the first mask builds the lexer's states
    compile_s = time.perf_counter() - t0
    assert not matcher.is_error(), matcher.get_error()
    matcher.reset()

    def mask_into(bm: np.ndarray) -> None:
        matcher.unsafe_compute_mask_ptr(bm.ctypes.data, bm.nbytes)

    def advance(tok: int) -> None:
        assert matcher.consume_token(tok), matcher.get_error()

    walked: list[int] = []
    times = walk(mask_into, advance, matcher.is_stopped, matcher.reset, vocab, eos, walked)
    return {
        "version": llguidance.__version__,
        "prep_s": prep,
        "compile_s": compile_s,
        "times": times,
        "walked": walked,
    }


def bench_xgrammar(tokenizer: Any, vocab: int, eos: int) -> dict[str, Any]:
    import xgrammar as xgr

    t0 = time.perf_counter()
    info = xgr.TokenizerInfo.from_huggingface(
        tokenizer._tokenizer, vocab_size=vocab, stop_token_ids=[eos]
    )
    compiler = xgr.GrammarCompiler(info, cache_enabled=False)
    prep = time.perf_counter() - t0
    t0 = time.perf_counter()
    compiled = compiler.compile_json_schema(json.dumps(SCHEMA), any_whitespace=False)
    matcher = xgr.GrammarMatcher(compiled)
    compile_s = time.perf_counter() - t0

    class _Ptr:  # fill_next_token_bitmask takes a DLPack tensor; numpy arrays are one
        pass

    def mask_into(bm: np.ndarray) -> None:
        matcher.fill_next_token_bitmask(bm.reshape(1, -1))

    def advance(tok: int) -> None:
        assert matcher.accept_token(tok)

    walked: list[int] = []
    times = walk(mask_into, advance, matcher.is_terminated, matcher.reset, vocab, eos, walked)
    from importlib.metadata import version

    return {
        "version": version("xgrammar"),
        "prep_s": prep,
        "compile_s": compile_s,
        "times": times,
        "walked": walked,
    }


def _byte_decoder() -> dict[str, int]:
    # GPT-2's byte-level alphabet (SmolLM2's tokenizer uses it): printable stand-ins for bytes.
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1))
    bs += list(range(ord("®"), ord("ÿ") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return {chr(c): b for b, c in zip(bs, cs, strict=True)}


def bench_outlines(tokenizer: Any, vocab: int, eos: int) -> dict[str, Any]:
    import outlines_core

    t0 = time.perf_counter()
    decoder = _byte_decoder()
    mapping: dict[bytes, list[int]] = {}
    for token, tid in tokenizer._tokenizer.get_vocab().items():
        if tid == eos or tid >= vocab:
            continue
        try:
            key = bytes(decoder[c] for c in token)
        except KeyError:
            continue  # a special token spelled outside the byte alphabet
        mapping.setdefault(key, []).append(tid)
    vocabulary = outlines_core.Vocabulary(eos, mapping)
    prep = time.perf_counter() - t0
    t0 = time.perf_counter()
    regex = outlines_core.json_schema.build_regex_from_schema(json.dumps(SCHEMA))
    index = outlines_core.Index(regex, vocabulary)
    guide = outlines_core.Guide(index)
    compile_s = time.perf_counter() - t0

    def mask_into(bm: np.ndarray) -> None:
        guide.write_mask_into(bm.ctypes.data, bm.size, 4)

    def advance(tok: int) -> None:
        guide.advance(tok, return_tokens=False)

    walked: list[int] = []
    times = walk(mask_into, advance, guide.is_finished, guide.reset, vocab, eos, walked)
    from importlib.metadata import version

    return {
        "version": version("outlines-core"),
        "prep_s": prep,
        "compile_s": compile_s,
        "times": times,
        "walked": walked,
    }


def baseline(vocab: int) -> dict[str, Any]:
    """The part every library shares: applying a mask to a logits row and picking a token."""
    import mlx.core as mx

    rng = np.random.default_rng(0)
    bitmask = np.full((vocab + 31) // 32, -1, dtype=np.int32)
    times = []
    for _ in range(MAX_STEPS):
        logits = mx.array(rng.standard_normal(vocab).astype(np.float32))
        mx.eval(logits)
        t0 = time.perf_counter()
        int(mx.argmax(apply_mask(logits, bitmask, vocab)).item())
        times.append(time.perf_counter() - t0)
    return {
        "library": "(mask apply + argmax only)",
        "per_token_median_ms": statistics.median(times) * 1e3,
    }


def summarise(name: str, raw: dict[str, Any], tokenizer: Any) -> dict[str, Any]:
    times = raw.pop("times")
    raw["text"] = tokenizer.decode(raw.pop("walked"))
    library = sorted(t[0] for t in times)
    total = sorted(t[1] for t in times)
    return {
        "library": name,
        **raw,
        "tokens": len(times),
        "library_per_token_median_ms": statistics.median(library) * 1e3,
        "library_per_token_p90_ms": library[int(0.9 * (len(library) - 1))] * 1e3,
        "per_token_median_ms": statistics.median(total) * 1e3,
    }


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", default="examples/results/constraints.json")
    parser.add_argument("--xgrammar-path", default="", help="extra sys.path entries, ':'-joined")
    args = parser.parse_args()
    sys.path.extend(p for p in args.xgrammar_path.split(":") if p)

    from mlx_lm.tokenizer_utils import load as load_tokenizer

    from router.lanes.modelprep import ensure_default_models

    model_dir = Path(ensure_default_models()[0])
    tokenizer = load_tokenizer(model_dir)
    vocab = len(tokenizer._tokenizer)
    eos = tokenizer.eos_token_id
    results = [baseline(vocab)]
    print(json.dumps(results[0]), flush=True)
    for name, bench in (
        ("llguidance", bench_llguidance),
        ("xgrammar", bench_xgrammar),
        ("outlines-core", bench_outlines),
    ):
        try:
            row = summarise(name, bench(tokenizer, vocab, eos), tokenizer)
        except Exception as e:  # report a library that cannot run here instead of stopping
            row = {"library": name, "error": f"{type(e).__name__}: {e}"}
        print(json.dumps(row), flush=True)
        results.append(row)
    out = {
        "vocab": vocab,
        "schema": SCHEMA,
        "results": results,
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
    }
    Path(args.out).write_text(json.dumps(out, indent=2) + "\n")


if __name__ == "__main__":
    main()
