"""MambaLMHeadModel.generate (runtime/torch_model.py): mamba-ssm's decode loop (mamba_ssm.utils.generation.decode)
on this package's layers: one prefill of the prompt, then one token per step through the inference cache, eager or
replayed from a CUDA graph captured per batch size (cg=True).

A captured step reads the derived tensors (transposed weights) of the weights it was captured with, so a graph is
kept with the model's weights_key() and captured again when any weight was replaced or updated in place; the
prompt's ids are range-checked once (the decode steps feed the sampler's own ids, below the vocabulary).
"""

from __future__ import annotations

import time

import torch

from mamba_forge.runtime.torch_layer import InferenceParams
from mamba_forge.runtime.torch_model import GenerationOutput, check_input_ids

WARMUP_STEPS = 2  # eager decode steps on a side stream before a capture (mamba-ssm's n_warmups)


def _number(name: str, v, lo: float, hi: float, *, lo_open: bool = False, hi_open: bool = False) -> float:
    if isinstance(v, bool) or not isinstance(v, (int, float)) or v != v:
        raise ValueError(f"generate: {name}={v!r} is not a number")
    if v < lo or v > hi or (lo_open and v == lo) or (hi_open and v == hi):
        raise ValueError(f"generate: {name}={v!r} outside {'(' if lo_open else '['}{lo}, {hi}{')' if hi_open else ']'}")
    return float(v)


def check_sampling(top_k, top_p, min_p, temperature, repetition_penalty) -> None:
    """The sampling arguments' ranges (mamba-ssm asserts some, ignores others): top_k an integer >= 0 (0: no
    limit, 1: greedy), top_p in [0, 1], min_p in [0, 1), temperature > 0, repetition_penalty > 0."""
    if isinstance(top_k, bool) or not isinstance(top_k, int) or top_k < 0:
        raise ValueError(f"generate: top_k={top_k!r}: an integer >= 0 (1 greedy, 0 no limit)")
    _number("top_p", top_p, 0.0, 1.0)
    _number("min_p", min_p, 0.0, 1.0, hi_open=True)
    _number("temperature", temperature, 0.0, float("inf"), lo_open=True, hi_open=True)
    _number("repetition_penalty", repetition_penalty, 0.0, float("inf"), lo_open=True, hi_open=True)


def sample(logits: torch.Tensor, top_k: int = 1, top_p: float = 0.0, min_p: float = 0.0,
           temperature: float = 1.0) -> torch.Tensor:
    """Token ids [b] from logits [b, vocab]: argmax for top_k == 1; else softmax sampling (torch.multinomial,
    torch's generator) over the top_k logits (all for 0) divided by temperature, less the tail past top_p's
    cumulative probability and the tokens under min_p times the most likely one's probability."""
    if top_k == 1:
        return logits.argmax(dim=-1)
    vals = logits.float() / temperature
    idx = None
    if top_k > 0:
        vals, idx = torch.topk(vals, min(top_k, vals.shape[-1]), dim=-1)
    if 0.0 < top_p < 1.0:
        ordered, order = torch.sort(vals, dim=-1)  # ascending: the tail first
        drop = ordered.softmax(dim=-1).cumsum(dim=-1) <= 1 - top_p  # the most likely token always stays
        vals = vals.masked_fill(drop.scatter(-1, order, drop), float("-inf"))
    if min_p > 0.0:
        probs = vals.softmax(dim=-1)
        vals = vals.masked_fill(probs < min_p * probs.amax(dim=-1, keepdim=True), float("-inf"))
    choice = torch.multinomial(vals.softmax(dim=-1), num_samples=1)
    return (choice if idx is None else idx.gather(-1, choice)).squeeze(-1)


def penalise_repeats(logits: torch.Tensor, seen: torch.Tensor, penalty: float) -> torch.Tensor:
    """The CTRL repetition penalty (mamba-ssm's): each seen token's logit divided by penalty, or multiplied where
    negative. logits [b, vocab] (a new tensor), seen [b, L]."""
    score = torch.gather(logits, 1, seen)
    score = torch.where(score < 0, score * penalty, score / penalty)
    return logits.scatter(1, seen, score)


def check_capture_device(device) -> None:
    """cg=True replays CUDA graphs: a model elsewhere is refused."""
    if device.type != "cuda":
        raise ValueError(f"generate: cg=True replays CUDA graphs; the model is on {device}")


def capture(fn, device):
    """(graph, out): fn() captured in a CUDA graph after WARMUP_STEPS eager calls on a side stream (mamba-ssm's
    capture_graph), out its output tensor, which graph.replay() rewrites."""
    side = torch.cuda.Stream(device=device)
    side.wait_stream(torch.cuda.current_stream(device))
    with torch.cuda.stream(side):
        for _ in range(WARMUP_STEPS):
            fn()
    torch.cuda.current_stream(device).wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = fn()
    return graph, out


class DecodeGraph:
    """One batch size's decode step captured in a CUDA graph, on its own inference cache: run(tokens) copies the
    [b, 1] tokens in, replays and returns the step's logits [b, vocab] (a copy: the next replay reuses the output)."""

    def __init__(self, model, batch: int, ssm_dtype):
        device = model.lm_head.weight.device
        self.key = (batch, ssm_dtype, model.weights_key())
        cache = model.allocate_inference_cache(batch, 1, ssm_dtype=ssm_dtype)
        self.params = InferenceParams(max_seqlen=1, max_batch_size=batch, key_value_memory_dict=cache)
        self.ids = torch.zeros((batch, 1), dtype=torch.int64, device=device)
        model.prepare()  # the derived tensors exist before the capture, which then allocates none of them
        self.params.seqlen_offset = 1  # a decode step: the states are continued, not reset
        self.graph, self.logits = capture(lambda: model.logits_of(self.ids, self.params, 1), device)
        self.params.seqlen_offset = 0

    def run(self, tokens: torch.Tensor) -> torch.Tensor:
        self.ids.copy_(tokens)
        self.graph.replay()
        return self.logits[:, -1].clone()


def decode_graph(model, batch: int, ssm_dtype) -> DecodeGraph:
    """The model's graph for this batch size, captured now if it has none or its weights changed since."""
    got = model._graphs.get(batch)
    if got is None or got.key != (batch, ssm_dtype, model.weights_key()):
        model._graphs.pop(batch, None)  # the old graph's memory goes before the new one is captured
        got = model._graphs[batch] = DecodeGraph(model, batch, ssm_dtype)
    return got


def decode(model, input_ids, max_length, *, top_k=1, top_p=0.0, min_p=0.0, temperature=1.0,
           return_dict_in_generate=False, output_scores=False, repetition_penalty=1.0, eos_token_id=None,
           teacher_outputs=None, vocab_size=None, cg=False, streamer=None, ssm_dtype=None, enable_timing=False):
    """MambaLMHeadModel.generate's loop (its docstring); mamba-ssm's stopping rule: max_length tokens in all, or
    every sequence's last token eos_token_id."""
    started = time.perf_counter()
    vocab = model.lm_head.weight.shape[0]
    device = model.lm_head.weight.device
    check_input_ids(input_ids, vocab, device)
    check_sampling(top_k, top_p, min_p, temperature, repetition_penalty)
    batch, prompt = input_ids.shape
    if isinstance(max_length, bool) or not isinstance(max_length, int) or max_length <= prompt:
        raise ValueError(f"generate: max_length={max_length!r} must be an integer past the prompt's {prompt} tokens")
    if vocab_size is not None and (isinstance(vocab_size, bool) or not isinstance(vocab_size, int)
                                   or not 1 <= vocab_size <= vocab):
        raise ValueError(f"generate: vocab_size={vocab_size!r}: the logits kept, 1..{vocab}")
    if teacher_outputs is not None:
        check_input_ids(teacher_outputs, vocab, device)
        if teacher_outputs.shape[0] != batch:
            raise ValueError(f"generate: teacher_outputs has {teacher_outputs.shape[0]} rows, input_ids {batch}")
    if cg:
        check_capture_device(device)
        graph = decode_graph(model, batch, ssm_dtype)
        params = graph.params
    else:
        graph = None
        params = InferenceParams(max_seqlen=max_length, max_batch_size=batch)
        params.key_value_memory_dict = model.allocate_inference_cache(batch, max_length, ssm_dtype=ssm_dtype)
    params.max_seqlen, params.seqlen_offset = max_length, 0
    if streamer is not None:
        streamer.put(input_ids.cpu())
    sequences, scores = [input_ids], []
    tokens = input_ids
    while True:
        if graph is not None and params.seqlen_offset > 0:
            logits = graph.run(tokens)
        else:
            logits = model.logits_of(tokens, params, 1)[:, -1]
        if vocab_size is not None:
            logits = logits[..., :vocab_size]
        if output_scores:
            scores.append(logits.clone())
        params.seqlen_offset += tokens.shape[1]
        if repetition_penalty != 1.0:
            logits = penalise_repeats(logits, torch.cat(sequences, dim=1), repetition_penalty)
        if teacher_outputs is not None and params.seqlen_offset < teacher_outputs.shape[1]:
            token = teacher_outputs[:, params.seqlen_offset]
        else:
            token = sample(logits, top_k=top_k, top_p=top_p, min_p=min_p, temperature=temperature)
        tokens = token.unsqueeze(1)
        sequences.append(tokens)
        if streamer is not None:
            streamer.put(tokens.cpu())
        if params.seqlen_offset + 1 >= max_length:
            break
        if eos_token_id is not None and bool((token == eos_token_id).all()):
            break
    if streamer is not None:
        streamer.end()
    out = torch.cat(sequences, dim=1)
    if enable_timing:  # mamba-ssm's line (its figure is between CUDA events; this one is wall time, drained)
        if out.is_cuda:
            torch.cuda.synchronize(out.device)
        print(f"Prompt processing + decoding time: {(time.perf_counter() - started) * 1e3:.0f}ms")
    if not return_dict_in_generate:
        return out
    return GenerationOutput(sequences=out, scores=tuple(scores) if output_scores else None)


__all__ = ["DecodeGraph", "WARMUP_STEPS", "capture", "check_capture_device", "check_sampling", "decode", "decode_graph",
           "penalise_repeats", "sample"]
