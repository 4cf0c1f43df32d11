"""The one host->device boundary: scheduler bookkeeping in, tensors built, model run,
sampled tokens and logprobs out as Python values."""

from __future__ import annotations

import dataclasses
import logging
from pathlib import Path
from typing import TYPE_CHECKING

import torch

from radixlm.runtime.attention.base import create_attention_backend, resolve_backend_name
from radixlm.runtime.config import EngineConfig
from radixlm.runtime.device import pick_device_dtype
from radixlm.runtime.forward_batch import ForwardBatch
from radixlm.runtime.gguf_load import is_gguf, native_blocks
from radixlm.runtime.kv_pool import KVPool, check_kv_cache_dtype
from radixlm.runtime.memory import available_memory, check_fits
from radixlm.runtime.models.llama import LlamaModel
from radixlm.runtime.models.native_gguf import NativeGGUFModel
from radixlm.runtime.models.quant import INT4_MAX_ROWS, int4_supported
from radixlm.runtime.models.shape import ModelConfig, native_unsupported
from radixlm.runtime.parallel import (
    TPGroup,
    TPGroupError,
    check_tp_size,
    local_hf_config,
    shard_state_dict,
    start_group,
)
from radixlm.runtime.request import Req
from radixlm.runtime.sampler import Sampler, SamplingInputs, accept_prefix, draw_uniform
from radixlm.runtime.step import ForwardMode, ScheduleBatch, StepOutput, StepPlan
from radixlm.runtime.weights import (
    checkpoint_dtype,
    gguf_file_types,
    gguf_source,
    load_gguf_blocks,
    load_hf_config,
    load_q4_1_linears,
    load_state_dict,
    quantize_linears,
)

if TYPE_CHECKING:
    from radixlm.runtime.early import EarlyWeights

logger = logging.getLogger(__name__)
# Steps of up to this many tokens run natively (decode batches, jump-forward steps);
# larger ones (prefill chunks) on the torch path.
NATIVE_MAX_ROWS = 64


def mix_seed(seed: int) -> int:
    """splitmix64 of ``seed``: the first draws of Mersenne Twister generators seeded with
    neighbouring integers are correlated (seeds 1234, 1235, 1236 all start below 0.17), and
    the sampler takes one uniform per token, so requests seeded 0, 1, 2... (or the ``n``
    samples of one request) would start alike."""
    z = (seed + 0x9E3779B97F4A7C15) & 0xFFFFFFFFFFFFFFFF
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & 0xFFFFFFFFFFFFFFFF
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & 0xFFFFFFFFFFFFFFFF
    return (z ^ (z >> 31)) >> 1  # 63 bits: what manual_seed takes on every platform


def native_library(config: EngineConfig, device: torch.device):
    """The native CPU library when this engine should use it (None: reference path)."""
    if device.type != "cpu" or config.weight_quant == "none" or config.tp_size > 1:
        return None
    from radixlm.native.build import load

    return load()


def create_native_decoder(lib, config: EngineConfig, model, pool: KVPool, blocks: dict,
                          every_step: bool = False, placed=None):
    """The native decoder for ``model`` on ``blocks`` (HF name -> QWeight; the rest dense):
    small steps, or with ``every_step`` all of them (a GGUF read as a GGUF, whose blocks
    are its only weights: the file map's pages are given back as the arena copies them).
    ``placed``: its weights placed already (``early.EarlyWeights.placing``'s result). None
    (logged) if it cannot run the model; with ``every_step`` that is a ValueError."""
    from radixlm.native.arena import give_back
    from radixlm.native.decoder import NativeDecoder, supported

    reason = supported(model, pool)
    if reason is not None:
        if every_step:
            raise ValueError(f"the native library cannot run this model: {reason}")
        logger.warning("native CPU ops cannot run this model (%s): reference path", reason)
        return None
    deterministic = config.enable_deterministic_inference  # every step here, one mode
    return NativeDecoder(lib, model, blocks, pool,
                         max_rows=None if every_step or deterministic else NATIVE_MAX_ROWS,
                         quant=config.weight_quant, act=config.activations,
                         release=give_back if every_step else None,
                         deterministic=deterministic, placed=placed)


def block_quantization(config: EngineConfig, model_dir) -> str | None:
    """The block type a checkpoint is quantized to at load (None: its own precision):
    ``quantization``, or q4_1 for ``weight_quant="int4"`` on a safetensors checkpoint.
    ``quantization`` on a GGUF that is already quantized is a ValueError naming both."""
    if config.quantization is not None:
        types = gguf_file_types(model_dir)
        if types is not None and types[1]:
            raise ValueError(
                f"quantization={config.quantization!r} asked for a GGUF model that is "
                f"already quantized (file type {types[0]}; tensors {', '.join(types[1])}): "
                "a GGUF model runs its own blocks; drop quantization (--quantization)")
        return config.quantization
    if config.weight_quant == "int4" and gguf_source(model_dir) is None:
        return "q4_1"
    return None


def _reads_gguf_natively(config: EngineConfig, model_dir, hf_config, lib) -> bool:
    """Whether the model is a GGUF whose blocks are its only weights, every step native:
    with the native library, one rank, no re-quantization, a family the native layer runs
    (else the file is dequantized in memory for the torch path, logged)."""
    if lib is None or not is_gguf(model_dir) or config.tp_size != 1 or config.quantization:
        return False
    reason = native_unsupported(hf_config)
    if reason is not None:
        logger.info("%s runs on the torch path (dequantized in memory): %s",
                    Path(model_dir).name, reason)
    return reason is None


_SHORT = {torch.float32: "fp32", torch.bfloat16: "bf16", torch.float16: "fp16"}


def weights_bytes(model_dir) -> int:
    """Bytes the model's weights take in memory once loaded: a GGUF's size (its blocks
    are used as the file has them), else 0 (a checkpoint's precision at load varies; its
    pool is sized from what is free before loading, as before)."""
    return Path(model_dir).stat().st_size if is_gguf(model_dir) else 0


class ModelRunner:
    def __init__(self, config: EngineConfig, model_dir, context_len: int,
                 tp: TPGroup | None = None, early: EarlyWeights | None = None) -> None:
        """Rank 0 (``tp`` None) starts the other tensor-parallel ranks itself when
        ``config.tp_size > 1``; a spawned rank passes its own ``tp`` group. ``early``: a
        GGUF's weights placed while torch was imported (``runtime/early.py``), used where
        this runner reads the file natively in the dtype they were placed for."""
        self.config, self.model_dir = config, model_dir  # (the disk cache tier's fingerprint)
        hf_config = load_hf_config(model_dir)
        self.device, self.dtype = pick_device_dtype(config, checkpoint_dtype(model_dir, hf_config))
        rank = tp.rank if tp is not None else 0
        if tp is not None and self.device.type == "cuda":
            self.device = torch.device("cuda", rank % config.tp_per_node)
        model_hf = hf_config
        if config.tp_size > 1:
            check_tp_size(hf_config, config.tp_size, self.device.type, nnodes=config.nnodes)
            model_hf = local_hf_config(hf_config, rank, config.tp_size)
        local = ModelConfig.from_hf(model_hf)
        lib = native_library(config, self.device)  # None under TP
        self.gguf_native = _reads_gguf_natively(config, model_dir, hf_config, lib)
        early = self._take_early(early)
        capacity = self._pool_capacity(config, local, context_len, weights_bytes(model_dir),
                                       free=early and early.free)
        self.tp = tp
        if config.tp_size > 1 and tp is None:  # rank 0: every rank gets the same pool size
            worker_config = dataclasses.replace(config, max_total_tokens=capacity - 1)
            self.tp = start_group(worker_config, self.device, model_dir, context_len, ModelRunner)
        if self.tp is not None:  # sums over the ranks in one order (more than 2 ranks)
            self.tp.fixed_order = config.enable_deterministic_inference
        try:
            blocks = self._load(config, model_dir, hf_config, model_hf, lib, early)
        except BaseException:
            self.shutdown()
            raise
        cfg = self.model.cfg
        self.vocab_size = self.model.vocab_size
        self.pool = self._create_pool(config, cfg, capacity, context_len)
        self.native = (create_native_decoder(lib, config, self.model, self.pool, blocks,
                                             every_step=self.gguf_native,
                                             placed=early and early.placing.result())
                       if lib is not None else None)
        del blocks, early  # (a GGUF's: views of the file map, whose pages the arena replaced)
        self.precision = self._precision(model_dir)
        name = self.attention_backend_name = self._create_attention(config, cfg, context_len)
        self.sampler = Sampler(self._bitmask_op(lib))
        self._generators: dict[str, torch.Generator] = {}
        if self.tp is not None:  # every rank loaded (rank 0: raises if one did not)
            try:
                self.tp.barrier()
            except BaseException:
                self.shutdown()
                raise
        self._check_invariance(name)
        self._log_start(capacity, name)

    def _create_attention(self, config: EngineConfig, cfg: ModelConfig,
                          context_len: int) -> str:
        """``self.attn`` for the torch path's steps; returns the backend's name. With
        ``enable_deterministic_inference`` its batch-invariant variant (no K/V mirror)."""
        # A window no shorter than the context never cuts anything (Mistral v0.1's 4096).
        layers = [dataclasses.replace(o, window=None) if o.window and o.window >= context_len
                  else o for o in cfg.attn_options()]
        name = resolve_backend_name(config.attention_backend, self.device,
                                    plain=all(o.plain for o in layers))
        invariant = config.enable_deterministic_inference
        options = {"layers": layers}
        if name == "torch" and not invariant and config.kv_mirror_mb is not None:
            options["mirror_budget_bytes"] = config.kv_mirror_mb << 20
        elif name == "torch" and not invariant and self.native is not None:
            options["mirror_budget_bytes"] = 0  # decode reads the pool in place natively
        self.attn = create_attention_backend(name, self.pool, cfg.num_heads, cfg.num_kv_heads,
                                             cfg.head_dim, invariant=invariant, **options)
        return name

    def _check_invariance(self, attention: str) -> None:
        """Set ``batch_invariant`` (a token's logits the same bits in any step: every step
        native with one activation mode that rounds alike at every step size, or, with
        ``enable_deterministic_inference``, the torch path's fixed-shape linears and
        attention); with the flag a setup that is not is a ValueError naming it."""
        native, deterministic = self.native, self.config.enable_deterministic_inference
        if native is None:  # the torch path (config refuses the flag off the CPU)
            self.batch_invariant = deterministic and self.device.type == "cpu"
        else:
            self.batch_invariant = native.batch_invariant
        if self.batch_invariant or not deterministic:
            return
        if native is None:
            why = (f"the torch path on {self.device} (attention backend {attention!r}: its "
                   "fixed-order linears and attention are the CPU's)")
        else:
            why = (f"native activations {native.describe_modes()!r} (the fp32 and bf16 "
                   "kernels sum in an order that depends on the step size; only int8 "
                   "activation blocks, for block-quantized weights on a CPU with u8 x s8 "
                   "SIMD, round a token alike in every step)")
        raise ValueError(f"enable_deterministic_inference cannot honour {why}")

    def _log_start(self, capacity: int, attention: str) -> None:
        extra = ("" if self.native is None else " (native: every step)"
                 if self.native.max_rows is None
                 else f" (+native steps up to {self.native.max_rows} tokens)")
        logger.info("model on %s/%s%s: weights %s, activations %s (%s); KV pool %d tokens "
                    "(%s), attention %s%s", self.device, self.dtype, extra,
                    self.precision["weights"], self.precision["activations"],
                    "batch-invariant" if self.batch_invariant else "not batch-invariant",
                    capacity, self.pool.layout, attention,
                    f", tp rank {self.tp.rank}/{self.tp.size}" if self.tp else "")

    def _take_early(self, early: EarlyWeights | None) -> EarlyWeights | None:
        """``early`` where its plan is this runner's (the file read natively, the dtype it
        assumed), else None: its placement waited for and let go (placed again here)."""
        dtype = str(self.dtype).removeprefix("torch.")  # (the name the early plan took)
        if early is None or (self.gguf_native and early.dtype == dtype):
            return early
        early.placing.exception()  # (its thread done with the arena, which goes with it)
        logger.info("weights placed at the start for %s, not this runner's plan: placed again",
                    early.dtype)
        return None

    def _load(self, config: EngineConfig, model_dir, hf_config, model_hf, lib,
              early: EarlyWeights | None = None) -> dict:
        """Build the model; returns the native path's blocks (HF name -> QWeight: the
        GGUF's own, or those made for ``quantization``; ``early``: the GGUF's read
        already)."""
        self.quantization = block_quantization(config, model_dir)
        if self.gguf_native:  # the file's blocks are the only weights
            self.int4 = None
            gguf = early.gguf if early is not None else native_blocks(model_dir, hf_config)
            self.model = NativeGGUFModel(hf_config, gguf.vectors, self.dtype, self.device,
                                         gguf.rope_pairs)
            return gguf.blocks
        # a GGUF dequantized straight into the model's dtype, unless blocks are made from it
        state = load_state_dict(model_dir, None if self.quantization else self.dtype)
        blocks = {}
        if self.quantization is not None:  # every path runs the blocks' values
            tied = bool(getattr(hf_config, "tie_word_embeddings", False)
                        or "lm_head.weight" not in state)
            blocks = quantize_linears(state, self.quantization, tied)
        elif lib is not None:
            blocks = load_gguf_blocks(model_dir, hf_config)
        if self.tp is not None:
            self.tp.vocab_size = int(state["model.embed_tokens.weight"].shape[0])
            state = shard_state_dict(state, hf_config, self.tp.rank, self.tp.size)
            self.int4 = None  # int4 source blocks are not sharded: plain weights under TP
        else:
            self.int4 = (None if lib is not None
                         else self._int4_blocks(config, model_dir, hf_config))
        self.model = LlamaModel(model_hf, state, self.dtype, self.device, self.int4, tp=self.tp,
                                batch_invariant=config.enable_deterministic_inference)
        return blocks

    def _bitmask_op(self, lib):
        """How the sampler applies a grammar's token bitmask: the model's kernel set's op
        (Triton on CUDA), in C where the torch twin would run and the library is here."""
        if lib is None or self.model.ops.name != "ref":
            return self.model.ops.apply_token_bitmask
        from radixlm.native.ops import bitmask_applier

        return bitmask_applier(lib)

    def _precision(self, model_dir) -> dict[str, str]:
        """Which weights and activations run (the start log line, /get_server_info): e.g.
        ``gguf q4_1, head q8_0`` / ``int8 one-token steps, fp32, bf16 from 8 tokens``;
        ``bf16`` / ``bf16`` on the torch path."""
        dtype = _SHORT.get(self.dtype, str(self.dtype))
        if self.native is not None:
            weights = self.native.weights
            if self.gguf_native:
                weights += " (the file's blocks, no dense copy)"
            if self.quantization is not None:
                weights += " (quantized at load)"
            return {"weights": weights, "activations": self.native.describe_modes()}
        source = ("gguf, dequantized" if gguf_source(model_dir) is not None
                  else f"{self.quantization} blocks, dequantized" if self.quantization
                  else "")
        weights = f"{dtype} ({source})" if source else dtype
        if self.int4 is not None:
            weights += " + int4 decode linears"
        return {"weights": weights, "activations": dtype}

    @property
    def fatal_error(self) -> str | None:
        """Why this runner can no longer run steps (a tensor-parallel rank died), or None."""
        return self.tp.poll() if self.tp is not None else None

    def shutdown(self) -> None:
        """Stop the other tensor-parallel ranks (nothing to do without TP)."""
        if self.tp is not None and self.tp.rank == 0:
            self.tp.shutdown()

    def _int4_blocks(self, config: EngineConfig, model_dir, hf_config) -> dict | None:
        """None (no int4), or exact Q4_1 source blocks ({} means quantize)."""
        if (config.weight_quant == "none" or self.device.type != "cpu" or not int4_supported()
                or config.enable_deterministic_inference):  # (one GEMM shape for all rows)
            return None
        if config.weight_quant == "auto" and self.dtype != torch.bfloat16:
            return None
        blocks = load_q4_1_linears(model_dir, hf_config)
        if config.weight_quant == "auto" and not blocks:
            return None
        return blocks

    def _create_pool(self, config: EngineConfig, cfg: ModelConfig, capacity: int,
                     context_len: int) -> KVPool:
        return KVPool(capacity, cfg.num_layers, cfg.num_kv_heads, cfg.head_dim, self.dtype,
                      self.device, config.max_running_requests + 1, context_len,
                      kv_cache_dtype=config.kv_cache_dtype)

    def _pool_capacity(self, config: EngineConfig, cfg: ModelConfig, context_len: int,
                       weights: int, free: int | None = None) -> int:
        """Slots of the pool: ``max_total_tokens`` + 1, else as many tokens as
        ``mem_fraction`` of the memory left after the weights (``weights`` bytes) holds in
        the K/V format (an int8 pool about twice a bf16 one's). Refused here, before
        anything is loaded, with the numbers: a format this device cannot store, and on a
        CPU a model whose weights and one context (or the asked pool) do not fit in the
        memory available (``free`` bytes where the weights are placed already: what was
        available before)."""
        check_kv_cache_dtype(config.kv_cache_dtype, self.device)
        per_token = KVPool.bytes_per_token(cfg.num_layers, cfg.num_kv_heads, cfg.head_dim,
                                           self.dtype, config.kv_cache_dtype)
        if self.device.type == "cuda":
            free, _ = torch.cuda.mem_get_info(self.device)
            left = free
        else:
            free = available_memory() if free is None else free
            left = free - weights
            check_fits(weights, per_token, free, context_len, config.max_total_tokens)
        if config.max_total_tokens is not None:
            return config.max_total_tokens + 1
        return int(max(left * config.mem_fraction // per_token, 1024)) + 1

    # ------------------------------------------------------------------ seeds
    def generator(self, req: Req) -> torch.Generator | None:
        """The request's own RNG (None for greedy rows): same seed, same draws, whatever
        else shares the batch."""
        if req.params.is_greedy:
            return None
        gen = self._generators.get(req.rid)
        if gen is None:
            gen = torch.Generator(device=self.device).manual_seed(mix_seed(req.seed))
            self._generators[req.rid] = gen
        return gen

    def release_generator(self, req: Req) -> None:
        self._generators.pop(req.rid, None)

    def rewind_generator(self, req: Req, state, draws: int) -> None:
        """Set a verified request's RNG to ``state`` (from ``StepOutput.rng_states``) and
        advance it by ``draws`` uniforms: one per token the step emitted for it, so its
        draws stay one per token, as without drafts (a seed gives the same text)."""
        gen = self._generators.get(req.rid)
        if gen is None:
            return
        gen.set_state(state)
        for _ in range(draws):
            draw_uniform(gen, self.device)

    def draft_room(self, base_tokens: int) -> int:
        """How many draft tokens a step of ``base_tokens`` tokens may add and still run on
        the path it runs on without them, with the same weights and activation rounding
        (so verification agrees with decoding): the native library up to its step size
        (``ForwardBatch.act_rows`` keeps the rounding); int4 linears up to theirs. (The
        torch path's GEMMs round a row by the call's row count, so there a verified token
        can differ from the decoded one in the last bit: exact for greedy text with any
        margin, not for a sample between near-tied probabilities.)"""
        if self.native is not None:
            if self.native.max_rows is None:  # every step runs natively
                return 64
            return max(self.native.max_rows - base_tokens, 0)
        if self.int4 is not None:
            return max(INT4_MAX_ROWS - base_tokens, 0) if base_tokens <= INT4_MAX_ROWS else 64
        return 64

    # ------------------------------------------------------------------ the step
    @torch.inference_mode()
    def forward(self, sb: ScheduleBatch, sampling: SamplingInputs | None) -> StepOutput:
        """Run the step; ``sampling`` has one row per sampled request, in batch order, and
        a verified request (``sb.drafts``) one row per position it samples at (its last
        pending token's, then each draft token's: ``sampling_inputs(..., drafts)``)."""
        plan, logit_rows, synced = self._plan(sb)
        if self.tp is None:
            logits, hidden = self.run_plan(plan)  # (L, V), (len(hidden_indices), hidden)
        else:  # every rank runs the same plan; any failure fails the group
            self.tp.check()
            try:
                self.tp.broadcast_plan(plan)
                logits, hidden = self.run_plan(plan)
            except Exception as exc:
                self.tp.diagnose()  # a dead worker is the likely cause: name it if so
                self.tp.fail(f"step failed on rank 0: {exc}")
                raise TPGroupError(self.tp.error) from exc
        for req, end in synced:  # only once written (a failed step is retried)
            req.row_synced = end
        out = StepOutput({}, {}, {})
        if hidden is not None:
            self._pool(hidden, logit_rows, out)
        self._fill_logprobs(sb, logits, logit_rows, out)
        sample_idx = [i for i, s in enumerate(sb.sample) if s]
        if sample_idx:
            self._sample(sb, logits, [logit_rows[i]["sample"] for i in sample_idx],
                         sample_idx, sampling, out)
        return out

    def _pool(self, hidden: torch.Tensor, logit_rows: list[dict], out: StepOutput) -> None:
        """Encode requests' hidden states: the final norm in fp32 (transformers' RMSNorm on
        an fp32 upcast), summed over each request's positions of the step in fp64."""
        cfg = self.model.cfg
        normed = torch.nn.functional.rms_norm(hidden.float(), (hidden.shape[-1],),
                                              self.model.norm.float(), cfg.rms_norm_eps)
        segments = [(i, rows["hidden"]) for i, rows in enumerate(logit_rows) if "hidden" in rows]
        sums = torch.stack([normed[start:start + n].double().sum(0)
                            for _, (start, n) in segments]).cpu().numpy()
        for j, (i, _) in enumerate(segments):
            out.embeddings[i] = sums[j]

    def _fill_logprobs(self, sb: ScheduleBatch, logits: torch.Tensor, logit_rows: list[dict],
                       out: StepOutput) -> None:
        """Logprobs of the prompt and forced tokens whose logits the step computed."""
        lp_rows = [(i, pos, r) for i, rows in enumerate(logit_rows) for pos, r in rows["lp"]]
        if not lp_rows:
            return
        rows_t = torch.tensor([r for _, _, r in lp_rows], device=self.device)
        lps = torch.log_softmax(logits[rows_t], dim=-1)
        targets = torch.tensor([sb.reqs[i].fill_slice(pos + 1, pos + 2)[0]
                                for i, pos, _ in lp_rows], device=self.device)
        chosen = lps.gather(1, targets[:, None]).squeeze(1).tolist()
        max_top = max(sb.reqs[i].logprob.top_logprobs_num for i, _, _ in lp_rows)
        if max_top > 0:
            top_v, top_i = lps.topk(max_top, dim=-1)
            top_v, top_i = top_v.tolist(), top_i.tolist()
        for j, (i, pos, _) in enumerate(lp_rows):
            n = sb.reqs[i].logprob.top_logprobs_num
            top = list(zip(top_v[j][:n], top_i[j][:n])) if n > 0 else []
            out.fill_logprobs.setdefault(i, []).append((pos + 1, chosen[j], top))

    def _sample(self, sb: ScheduleBatch, logits: torch.Tensor, rows: list[list[int]],
                sample_idx: list[int], sampling: SamplingInputs, out: StepOutput) -> None:
        """Sample every row; a verified request keeps the draft tokens the model's own
        samples agree with (``accept_prefix``) and the sample after them."""
        flat = [r for rs in rows for r in rs]
        if flat != list(range(logits.shape[0])):  # (decode: all rows, in order)
            logits = logits[torch.tensor(flat, device=self.device)]
        drafts = sb.drafts
        if drafts:  # the RNG state before a verified request's draws (rewind_generator)
            for i in sample_idx:
                gen = self._generators.get(sb.reqs[i].rid) if drafts[i] else None
                if gen is not None:
                    out.rng_states[i] = gen.get_state()
        result = self.sampler(logits, sampling)
        start = 0
        for i, rs in zip(sample_idx, rows):
            ids = result.next_ids[start:start + len(rs)]
            lps = list(zip(result.logprobs[start:start + len(rs)],
                           result.top_logprobs[start:start + len(rs)]))
            start += len(rs)
            m = accept_prefix(drafts[i], ids) if drafts and drafts[i] else 0
            out.next_ids[i] = ids[m]
            out.logprobs[i] = lps[m]
            if drafts and drafts[i]:
                out.accepted[i] = drafts[i][:m]
                out.accepted_logprobs[i] = lps[:m]

    def _plan(self, sb: ScheduleBatch) -> tuple[StepPlan, list[dict], list[tuple[Req, int]]]:
        """The step's forward inputs as plain lists, which logits rows belong to which
        request, and the (request, end) pairs whose req_to_token rows the plan writes."""
        drafts = sb.drafts or [()] * len(sb.reqs)
        lens = [n + len(d) for n, d in zip(sb.extend_lens, drafts)]
        plan = StepPlan(ForwardMode.EXTEND if sb.drafts else sb.mode, [], [], [],
                        [r.row for r in sb.reqs], [p + n for p, n in zip(sb.prefix_lens, lens)],
                        list(sb.prefix_lens), lens, [], [], [r.uid for r in sb.reqs],
                        ([], [], []), act_rows=sum(sb.extend_lens) if sb.drafts else None)
        sync_rows, sync_cols, sync_vals = plan.table_writes
        synced: list[tuple[Req, int]] = []
        logits_indices = plan.logits_indices
        logit_rows: list[dict] = []
        t = 0
        for req, p, n, sample, draft in zip(sb.reqs, sb.prefix_lens, sb.extend_lens, sb.sample,
                                            drafts):
            k = len(draft)
            plan.input_ids.extend(req.fill_slice(p, p + n))
            plan.input_ids.extend(draft)
            plan.positions.extend(range(p, p + n + k))
            plan.out_loc.extend(req.kv_slots[p:p + n + k])
            end = p + n + k
            if req.row_synced < end:
                sync_rows.extend([req.row] * (end - req.row_synced))
                sync_cols.extend(range(req.row_synced, end))
                sync_vals.extend(req.kv_slots[req.row_synced:end])
                synced.append((req, end))
            rows: dict = {"lp": [], "sample": []}
            if req.embed:  # (start in hidden_indices, count): every position of the step
                rows["hidden"] = (len(plan.hidden_indices), n)
                plan.hidden_indices.extend(range(t, t + n))
            if req.logprob.return_logprob:
                n_input, n_known = len(req.input_ids), len(req.output_token_logprobs)
                for pos in range(p, min(p + n, req.fill_len - 1)):
                    nxt = pos + 1  # the token whose logprob the logits at `pos` give
                    wanted = (nxt >= req.logprob_start if nxt < n_input
                              else nxt - n_input >= n_known)
                    if wanted:
                        rows["lp"].append((pos, len(logits_indices)))
                        logits_indices.append(t + pos - p)
            if sample:  # the last pending token's position, then each draft token's
                rows["sample"] = list(range(len(logits_indices), len(logits_indices) + k + 1))
                logits_indices.extend(range(t + n - 1, t + n + k))
            logit_rows.append(rows)
            plan.extend_starts.append(t)
            t += n + k
        return plan, logit_rows, synced

    @torch.inference_mode()
    def run_plan(self, plan: StepPlan) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Tensors from the plan, req_to_token rows written, the model run: logits
        ``[len(plan.logits_indices), V]`` and the last hidden states (before the final norm)
        at ``plan.hidden_indices`` (None without). Under TP every rank calls this with the
        same plan (rank 0 from ``forward``, the others from their worker loop)."""
        dev = self.device
        rows, cols, vals = plan.table_writes
        if rows:
            self.pool.req_to_token[torch.tensor(rows, device=dev),
                                   torch.tensor(cols, device=dev)] = (
                torch.tensor(vals, dtype=torch.int32, device=dev))

        def tensor(values: list[int]) -> torch.Tensor:
            return torch.tensor(values, dtype=torch.int64, device=dev)

        fb = ForwardBatch(
            mode=plan.mode,
            input_ids=tensor(plan.input_ids),
            positions=tensor(plan.positions),
            out_cache_loc=tensor(plan.out_loc),
            req_pool_indices=tensor(plan.req_rows),
            seq_lens=tensor(plan.seq_lens),
            prefix_lens=tensor(plan.prefix_lens),
            extend_lens=tensor(plan.extend_lens),
            extend_start_loc=tensor(plan.extend_starts),
            logits_indices=tensor(plan.logits_indices),
            act_rows=plan.act_rows,
            hidden_indices=tensor(plan.hidden_indices) if plan.hidden_indices else None,
            seq_lens_cpu=plan.seq_lens,
            prefix_lens_cpu=plan.prefix_lens,
            extend_lens_cpu=plan.extend_lens,
            owner_ids=plan.owner_ids,
        )
        if self.native is not None and self.native.accepts(fb):
            return self.native.forward(fb), fb.hidden
        self.attn.init_forward_metadata(fb)
        return self.model.forward(fb, self.attn), fb.hidden

    def sampling_inputs(self, reqs: list[Req], generators: list, bitmask,
                        drafts: list[list[int]] | None = None) -> SamplingInputs:
        """Per-row sampling tensors for the requests that draw a token this step. With
        ``drafts`` (one per request), request ``i`` has ``1 + len(drafts[i])`` rows: row
        ``j`` samples the token after its first ``j`` draft tokens, with the penalties,
        banned tokens and RNG of a decode step at that point (``bitmask`` has the rows)."""
        if drafts is None:
            drafts = [()] * len(reqs)
        rows = [(r, g, list(d[:j])) for r, g, d in zip(reqs, generators, drafts)
                for j in range(len(d) + 1)]
        rep = [r.params.repetition_penalty for r, _, _ in rows]
        seen = None
        if any(x != 1.0 for x in rep):  # one list per request, shared by its rows
            fills = {id(r): r.fill_ids for r in reqs}
            seen = [fills[id(r)] for r, _, _ in rows]
        banned = []
        for r, _, ahead in rows:
            if len(r.output_ids) + len(ahead) < r.params.min_new_tokens:
                banned.append(sorted(set(r.params.stop_token_ids) | set(r.eos_ids)))
            else:
                banned.append([])
        return SamplingInputs(
            temperatures=[r.params.temperature for r, _, _ in rows],
            top_ks=[r.params.top_k for r, _, _ in rows],
            top_ps=[r.params.top_p for r, _, _ in rows],
            min_ps=[r.params.min_p for r, _, _ in rows],
            frequency_penalties=[r.params.frequency_penalty for r, _, _ in rows],
            presence_penalties=[r.params.presence_penalty for r, _, _ in rows],
            repetition_penalties=rep,
            output_ids=[r.output_ids + ahead if ahead else r.output_ids for r, _, ahead in rows],
            seen_ids=seen,
            seen_after=[ahead for _, _, ahead in rows] if seen is not None else None,
            banned_ids=banned,
            generators=[g for _, g, _ in rows],
            top_logprobs_nums=[r.logprob.top_logprobs_num if r.logprob.return_logprob else -1
                               for r, _, _ in rows],
            bitmask=(torch.from_numpy(bitmask).to(self.device) if bitmask is not None else None),
            logit_biases=[{int(t): b for t, b in r.params.logit_bias.items()}
                          if r.params.logit_bias else None for r, _, _ in rows],
        )
