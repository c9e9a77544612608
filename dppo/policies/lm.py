"""``policy=lm``: a local Hugging Face causal LM with a LoRA adapter, in the one policy protocol.

The model and tokenizer are loaded from a local directory (``policy.path``; ``local_files_only``, so
nothing is downloaded). With ``policy.lora`` set, a ``peft`` LoRA adapter is added and *only* its
parameters are trainable (the base weights are frozen): they are what the learners clip, noise and
update, and what is saved (``save_adapter``, loadable with ``peft.PeftModel.from_pretrained``).

Protocol (batched, left-padded prompts with attention masks, completions of at most ``max_new_tokens``):
- ``sample(prompt_ids, prompt_mask, uniforms=None)``: KV-cached generation; token t of row b is drawn by
  inverse-CDF from ``uniforms[b, t]`` (so each user's randomness is its own stream) or greedily
  (``uniforms=None``); returns the completion tokens, their mask (True up to and including EOS) and
  the completion log-probabilities under the sampling temperature.
- ``token_log_probs(prompt_ids, prompt_mask, completion_ids, completion_mask)``: differentiable per-token
  log-probabilities of given completions (zero on padding).
- ``reference()``: a context in which the adapter is disabled (the initial, public policy; KL penalty).
- ``generate(prompts)`` / ``predict(prompts)``: completions as text (greedy, or sampled), e.g. on a loaded run
  (``dppo.load(run_dir).policy.generate(["123+456="])``).
Prompts are strings, or conversations (lists of ``{"role", "content"}`` messages) rendered with the
tokenizer's chat template (``render``), as TRL renders conversational datasets.
"""
from __future__ import annotations

import contextlib
import os
import re
import sys
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import nn

from dppo.errors import ConfigError

REPO_ROOT = Path(__file__).resolve().parent.parent.parent
MODEL_DIR = "model"   # <run_dir>/model/: the released LM in the save_pretrained layout (``save_adapter``)


def resolve_path(path: str) -> str:
    """An existing directory: ``path`` as given (absolute or relative to the working directory), else
    relative to the repository root (so the shipped ``assets/`` work from any directory)."""
    if not path:
        raise ConfigError("policy.path must name a local directory with a Hugging Face causal LM")
    for cand in (Path(path), REPO_ROOT / path):
        if cand.is_dir():   # absolute: the saved adapter's base_model_name_or_path loads from any directory
            return os.path.abspath(cand)
    raise ConfigError(f"policy.path={path} is not a directory; give a local directory saved with "
                      f"save_pretrained (nothing is downloaded)")


def pick_device(device: str) -> torch.device:
    if device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if device not in ("cpu", "cuda") and not str(device).startswith("cuda:"):
        raise ConfigError(f"device must be cpu, cuda or auto, got '{device}'")
    if str(device).startswith("cuda") and not torch.cuda.is_available():
        raise ConfigError("device=cuda but no CUDA device is available; use device=cpu or device=auto")
    return torch.device(device)


# a Linear / Conv1D layer is an attention projection when its block's name says so (``self_attn``, ``attn``,
# ``attention``) or its own name is one of the usual projection names (``q_proj``, ``query_key_value``, ``Wqkv``, ...)
ATTENTION_BLOCK = re.compile(r"attn|attention", re.IGNORECASE)
ATTENTION_LAYER = re.compile(r"(w?(q|k|v|o|qkv)(_proj)?|query|key|value|query_key_value|c_attn|out_proj|in_proj"
                             r"|(query|key|value)_proj)", re.IGNORECASE)


def peft_lora_defaults() -> dict:
    """peft's own map of ``model_type`` -> default LoRA target modules (what ``get_peft_model`` picks when
    ``target_modules`` is None); {} when this peft does not expose it."""
    try:
        from peft.utils.constants import TRANSFORMERS_MODELS_TO_LORA_TARGET_MODULES_MAPPING as mapping
    except ImportError:
        try:
            from peft.utils import TRANSFORMERS_MODELS_TO_LORA_TARGET_MODULES_MAPPING as mapping
        except ImportError:
            return {}
    return dict(mapping)


def lora_targets(model) -> tuple[list[str] | str, str]:
    """The LoRA target modules of ``model`` when ``policy.lora.target_modules`` names none, and where they come
    from: peft's default for the model's ``config.model_type`` (``peft_lora_defaults``: ``c_attn`` for GPT-2,
    ``q_proj``/``v_proj`` for Llama, ...), as peft itself would pick; for a model type peft does not list (or
    whose listed names the model lacks), every ``nn.Linear`` / ``Conv1D`` layer of an attention block, named by
    its block and its own name (``self_attn.q_proj``). A ``ConfigError`` when there is none."""
    model_type = getattr(getattr(model, "config", None), "model_type", None)
    names = [n for n, _ in model.named_modules()]
    targets = peft_lora_defaults().get(model_type)
    if isinstance(targets, str):   # peft's regex form (matched against the full module names)
        if any(re.fullmatch(targets, n) for n in names):
            return targets, f"peft's default for model_type={model_type}"
    elif targets:
        leaves = {n.rsplit(".", 1)[-1] for n in names}
        if any(t in leaves for t in targets):
            return list(targets), f"peft's default for model_type={model_type}"
    layer_types: tuple = (nn.Linear,)
    try:
        from transformers.pytorch_utils import Conv1D   # GPT-2's projections

        layer_types += (Conv1D,)
    except ImportError:
        pass
    found, linear = [], []
    for name, module in model.named_modules():
        if not isinstance(module, layer_types) or not name:
            continue
        parts = name.split(".")
        linear.append(parts[-1])
        block = parts[-2] if len(parts) > 1 else ""
        if ATTENTION_BLOCK.search(block) or ATTENTION_LAYER.fullmatch(parts[-1]):
            target = ".".join(parts[-2:])
            if target not in found:
                found.append(target)
    if not found:
        shown = sorted(set(linear))[:12]
        raise ConfigError(f"policy.lora.target_modules is not set and the model (model_type={model_type}) has no "
                          f"layer named like an attention projection; name the layers to adapt, e.g. "
                          f"policy.lora.target_modules=[{','.join(shown[:2]) or 'name'}] (its linear layers: {shown})")
    return found, f"the attention projections of model_type={model_type} (peft lists no default for it)"


def conv1d_targets(model, targets) -> bool:
    """Whether LoRA ``targets`` (a list of names, matched as peft matches them: the name or a dotted suffix) hit
    a ``transformers`` ``Conv1D`` layer (GPT-2's)."""
    try:
        from transformers.pytorch_utils import Conv1D
    except ImportError:
        return False
    if isinstance(targets, str):
        return any(isinstance(m, Conv1D) and re.fullmatch(targets, n) for n, m in model.named_modules())
    return any(isinstance(m, Conv1D) and any(n == t or n.endswith("." + t) for t in targets)
               for n, m in model.named_modules())


@dataclass
class Completions:
    """``ids[B, T]`` (pad after EOS), ``mask[B, T]`` (True on generated tokens, EOS included),
    ``logp[B]`` (sum of the tokens' log-probabilities at sampling time), ``texts`` (decoded)."""

    ids: torch.Tensor
    mask: torch.Tensor
    logp: torch.Tensor
    texts: list[str]

    @property
    def tokens(self) -> int:
        return int(self.mask.sum())


class LMPolicy(nn.Module):
    """A causal LM + LoRA adapter (module docstring).

    Args:
        path: local model directory (``save_pretrained`` layout, with its tokenizer).
        lora: ``{r, alpha, dropout, target_modules, ...}`` (peft ``LoraConfig`` fields); null trains every
            parameter (small models only: per-user gradients of all weights are materialized).
            ``target_modules`` null (or absent): chosen per architecture (``lora_targets``: peft's default for
            the model type, else the attention projections), said in one line on stderr.
        max_new_tokens: completion length cap (tokens, EOS included).
        temperature: sampling temperature (log-probabilities are those of the tempered policy).
        micro_batch: sequences per forward pass (memory knob; results do not depend on it).
        dtype: ``float32`` | ``float64`` | ``bfloat16`` | ``float16``.
        device: ``cpu`` | ``cuda`` | ``auto``.
        attn_implementation: passed to ``from_pretrained`` (null: the library's default).
        observation_space, action_space: unused (the builder passes them to every policy).
    """

    def __init__(self, path: str, *, lora: dict | None = None, max_new_tokens: int = 8, temperature: float = 1.0,
                 micro_batch: int = 4096, dtype: str = "float32", device: str = "cpu",
                 attn_implementation: str | None = None, observation_space=None, action_space=None):
        super().__init__()
        from transformers import AutoModelForCausalLM, AutoTokenizer

        self.path = resolve_path(path)
        if max_new_tokens < 1 or not temperature > 0 or micro_batch < 1:
            raise ConfigError("policy: need max_new_tokens >= 1, temperature > 0, micro_batch >= 1")
        dtypes = {"float32": torch.float32, "float64": torch.float64, "bfloat16": torch.bfloat16,
                  "float16": torch.float16}
        if dtype not in dtypes:
            raise ConfigError(f"policy.dtype must be one of {sorted(dtypes)}, got '{dtype}'")
        self.device_ = pick_device(device)
        try:
            self.tokenizer = AutoTokenizer.from_pretrained(self.path, local_files_only=True)
            kwargs = {"attn_implementation": attn_implementation} if attn_implementation else {}
            model = AutoModelForCausalLM.from_pretrained(self.path, local_files_only=True, dtype=dtypes[dtype],
                                                         **kwargs)
        except (OSError, ValueError) as err:
            raise ConfigError(f"policy.path={path}: cannot load a causal LM and tokenizer "
                              f"({str(err).splitlines()[0]})") from None
        self.tokenizer.padding_side = "left"
        if self.tokenizer.pad_token_id is None:
            self.tokenizer.pad_token = self.tokenizer.eos_token
        if self.tokenizer.eos_token_id is None:
            raise ConfigError(f"the tokenizer in {self.path} has no EOS token; completions could not end")
        for p in model.parameters():
            p.requires_grad_(False)
        self.lora_config = None
        if lora:
            from peft import LoraConfig, get_peft_model

            spec = dict(lora)
            spec.setdefault("bias", "none")
            if spec.get("target_modules") is None:
                spec["target_modules"], source = lora_targets(model)
                shown = spec["target_modules"]
                shown = shown if isinstance(shown, str) else "[" + ", ".join(shown) + "]"
                print(f"dppo: note: policy.lora.target_modules is not set: LoRA on {shown} ({source})",
                      file=sys.stderr, flush=True)
            if "fan_in_fan_out" not in spec and conv1d_targets(model, spec["target_modules"]):
                spec["fan_in_fan_out"] = True   # GPT-2's Conv1D stores (in, out) weights; peft would warn and set it
            if "alpha" in spec:
                spec["lora_alpha"] = spec.pop("alpha")
            if "dropout" in spec:
                spec["lora_dropout"] = spec.pop("dropout")
            try:
                self.lora_config = LoraConfig(task_type="CAUSAL_LM", **spec)
                model = get_peft_model(model, self.lora_config)
            except (TypeError, ValueError) as err:
                msg = str(err).splitlines()[0]
                if "not found in the base model" in msg and lora.get("target_modules") is not None:
                    msg += ("; leave policy.lora.target_modules unset (null) to choose them for this "
                            "architecture")
                raise ConfigError(f"policy.lora: {msg}") from None
        else:
            for p in model.parameters():
                p.requires_grad_(True)
        self.model = model.to(self.device_)
        self.model.eval()  # no dropout: a user's log-probabilities are a function of its data only
        self.max_new_tokens, self.temperature, self.micro_batch = int(max_new_tokens), float(temperature), int(micro_batch)
        import inspect

        base = self.model.get_base_model() if hasattr(self.model, "get_base_model") else self.model
        self._cache_kw = "cache" if "cache" in inspect.signature(base.forward).parameters else "past_key_values"
        cfg = self.model.config
        self.context = getattr(cfg, "max_position_embeddings", None) or getattr(cfg, "n_positions", None)

    # ---- parameters -----------------------------------------------------------------------------
    def trainable(self) -> list[tuple[str, nn.Parameter]]:
        """The (name, parameter) pairs the learners update: the adapter's, in a fixed order."""
        return [(n, p) for n, p in self.model.named_parameters() if p.requires_grad]

    def num_trainable(self) -> int:
        return sum(p.numel() for _, p in self.trainable())

    def adapter_state(self) -> dict:
        return {n: p.detach().cpu().clone() for n, p in self.trainable()}

    def load_adapter_state(self, state: dict) -> None:
        params = dict(self.trainable())
        if set(params) != set(state):
            raise ConfigError("the checkpoint's adapter does not match policy.lora; resume with the same policy config")
        with torch.no_grad():
            for n, v in state.items():
                params[n].copy_(v.to(device=params[n].device, dtype=params[n].dtype))

    def save_adapter(self, directory: str) -> None:
        """The adapter (or, without LoRA, the whole model) and the tokenizer in the ``save_pretrained`` layout, as
        TRL's trainers save ``output_dir``: a LoRA adapter's ``adapter_config.json`` names the base model by its
        absolute local path (``base_model_name_or_path``), so ``AutoPeftModelForCausalLM.from_pretrained`` (or
        ``AutoModelForCausalLM``, with peft installed) loads base and adapter in one call; without LoRA the folder
        is a whole model for ``AutoModelForCausalLM.from_pretrained``. Only released weights and public config."""
        os.makedirs(directory, exist_ok=True)
        self.model.save_pretrained(directory)
        self.tokenizer.save_pretrained(directory)

    @contextlib.contextmanager
    def reference(self):
        """The initial (public) policy: the adapter disabled (LoRA only)."""
        if self.lora_config is None:
            raise ConfigError("a KL penalty to the initial policy needs policy.lora (the base stays frozen)")
        with self.model.disable_adapter():
            yield

    # ---- tokens -----------------------------------------------------------------------------------
    def render(self, prompts: list) -> list[str]:
        """Prompt texts: a string as given; a conversation (a list of ``{"role", "content"}`` messages, TRL's
        conversational format) through the tokenizer's chat template with the generation prompt appended."""
        out = []
        for p in prompts:
            if isinstance(p, str):
                out.append(p)
                continue
            if not getattr(self.tokenizer, "chat_template", None):
                raise ConfigError(f"a conversational prompt needs a chat template, and the tokenizer in {self.path} "
                                  f"has none; give plain-text prompts or set tokenizer.chat_template")
            out.append(self.tokenizer.apply_chat_template(list(p), tokenize=False, add_generation_prompt=True))
        return out

    def encode(self, prompts: list) -> tuple[torch.Tensor, torch.Tensor]:
        """Left-padded prompt ids and attention mask (``render``ed; no special tokens added: the text is used as
        given, a chat template's own tokens included)."""
        enc = self.tokenizer(self.render(prompts), padding=True, return_tensors="pt", add_special_tokens=False)
        return enc["input_ids"].to(self.device_), enc["attention_mask"].to(self.device_)

    def prompt_lengths(self, prompts: list) -> list[int]:
        return [len(x) for x in self.tokenizer(self.render(prompts), add_special_tokens=False)["input_ids"]]

    def decode(self, ids: torch.Tensor, mask: torch.Tensor) -> list[str]:
        return [self.tokenizer.decode(row[m].tolist(), skip_special_tokens=True) for row, m in zip(ids, mask)]

    # ---- the protocol -------------------------------------------------------------------------------
    @torch.no_grad()
    def sample(self, prompt_ids: torch.Tensor, prompt_mask: torch.Tensor, uniforms: torch.Tensor | None = None,
               group: int = 1) -> Completions:
        """``group`` completions per prompt row (row-major: prompt i's completions are rows i*group ..), KV-cached;
        ``uniforms[rows * group, max_new_tokens]`` in [0, 1), or None (greedy)."""
        per = max(1, self.micro_batch // group)
        parts = []
        for i in range(0, prompt_ids.shape[0], per):
            u = None if uniforms is None else uniforms[i * group:(i + per) * group]
            parts.append(self._sample(prompt_ids[i:i + per], prompt_mask[i:i + per], u, group))
        T = self.max_new_tokens
        ids = torch.cat([torch.nn.functional.pad(p[0], (0, T - p[0].shape[1]), value=self.tokenizer.pad_token_id)
                         for p in parts])
        mask = torch.cat([torch.nn.functional.pad(p[1], (0, T - p[1].shape[1]), value=False) for p in parts])
        logp = torch.cat([p[2] for p in parts])
        return Completions(ids, mask, logp, self.decode(ids, mask))

    def _prefill(self, ids, attn, group: int):
        """Forward the prompts once; the KV cache and last logits repeated ``group`` times per prompt."""
        pos = (attn.long().cumsum(-1) - 1).clamp_min(0)
        out = self.model(input_ids=ids, attention_mask=attn, position_ids=pos, use_cache=True)
        cache, logits = self._cache_of(out), out.logits[:, -1]
        if group > 1:
            cache.batch_repeat_interleave(group)
            logits, attn, pos = (t.repeat_interleave(group, 0) for t in (logits, attn, pos))
        return cache, logits, attn, pos[:, -1:]

    def _sample(self, ids, attn, uniforms, group):
        eos, pad = self.tokenizer.eos_token_id, self.tokenizer.pad_token_id
        past, logits, attn, last = self._prefill(ids, attn, group)
        B = logits.shape[0]
        finished = torch.zeros(B, dtype=torch.bool, device=ids.device)
        toks, masks = [], []
        logp = torch.zeros(B, dtype=torch.float64, device=ids.device)
        for t in range(self.max_new_tokens):
            lp_all = torch.log_softmax(logits.double() / self.temperature, dim=-1)
            if uniforms is None:
                tok = lp_all.argmax(-1)
            else:
                cdf = lp_all.exp().cumsum(-1)
                u = uniforms[:, t].to(cdf)[:, None] * cdf[:, -1:]
                tok = (cdf <= u).sum(-1).clamp_max(lp_all.shape[-1] - 1)  # inverse-CDF sampling
            live = ~finished
            tok = torch.where(live, tok, torch.full_like(tok, pad))
            logp += torch.where(live, lp_all.gather(-1, tok[:, None]).squeeze(-1), torch.zeros_like(logp))
            toks.append(tok)
            masks.append(live)
            finished = finished | (tok == eos)
            if bool(finished.all()) or t == self.max_new_tokens - 1:
                break
            attn = torch.cat([attn, live[:, None].to(attn.dtype)], dim=1)
            last = last + 1
            out = self.model(input_ids=tok[:, None], attention_mask=attn, position_ids=last, use_cache=True,
                             **{self._cache_kw: past})
            past, logits = self._cache_of(out), out.logits[:, -1]
        return torch.stack(toks, 1), torch.stack(masks, 1), logp

    @staticmethod
    def _cache_of(out):
        cache = getattr(out, "cache", None)  # transformers >= 5.2x names the KV cache `cache`
        return cache if cache is not None else out.past_key_values

    def token_log_probs(self, prompt_ids: torch.Tensor, prompt_mask: torch.Tensor, completion_ids: torch.Tensor,
                        completion_mask: torch.Tensor, group: int = 1) -> torch.Tensor:
        """(B, T) log pi(y_t | x, y_<t) of the given completion tokens, zero on padding; differentiable.

        ``group > 1``: ``prompt_ids`` holds one row per prompt and ``completion_ids`` ``group`` rows per prompt
        (row-major); the prompt is forwarded once and its KV cache shared by its completions (same values,
        fewer FLOPs). Otherwise prompts and completions are row-aligned.
        """
        T = completion_ids.shape[1]
        cache, first, attn, last = self._prefill(prompt_ids, prompt_mask.long(), group)
        logits = first[:, None]
        if T > 1:
            attn = torch.cat([attn, completion_mask[:, :-1].long()], dim=1)
            pos = last + torch.arange(1, T, device=last.device)[None, :]
            out = self.model(input_ids=completion_ids[:, :-1], attention_mask=attn, position_ids=pos,
                             use_cache=True, **{self._cache_kw: cache})
            logits = torch.cat([logits, out.logits], dim=1)
        if logits.dtype in (torch.float16, torch.bfloat16):
            logits = logits.float()
        lp = torch.log_softmax(logits / self.temperature, dim=-1)
        lp = lp.gather(-1, completion_ids[..., None]).squeeze(-1)
        return lp * completion_mask.to(lp.dtype)

    def forward(self, *args, **kwargs):
        return self.token_log_probs(*args, **kwargs)

    # ---- inference -----------------------------------------------------------------------------------
    @torch.no_grad()
    def generate(self, prompts, *, greedy: bool = True, num_samples: int = 1, max_new_tokens: int | None = None,
                 seed: int | None = None, generator: torch.Generator | None = None):
        """Completions (text, without the prompt, cut at EOS) of ``prompts``: a string, a conversation, or a list
        of them. Greedy by default; ``greedy=False`` samples at the policy's temperature from ``generator``
        (or a fresh one seeded with ``seed``; neither: torch's global generator), ``num_samples`` each.

        Returns a string per prompt (a list of ``num_samples`` strings when ``num_samples > 1``); a single
        prompt gives a single result, a list of prompts a list.
        """
        single = isinstance(prompts, str) or (isinstance(prompts, (list, tuple)) and len(prompts) > 0
                                              and isinstance(prompts[0], dict))
        batch = [prompts] if single else list(prompts)
        if not batch:
            return []
        k = int(num_samples)
        if k < 1 or (greedy and k > 1):
            raise ConfigError("generate: num_samples must be >= 1, and > 1 only with greedy=False")
        cap = self.max_new_tokens
        if max_new_tokens is not None:
            if max_new_tokens < 1:
                raise ConfigError(f"generate: max_new_tokens must be >= 1, got {max_new_tokens}")
            self.max_new_tokens = int(max_new_tokens)
        try:
            ids, mask = self.encode(batch)
            u = None
            if not greedy:
                if generator is None and seed is not None:
                    generator = torch.Generator().manual_seed(int(seed))
                u = torch.rand(len(batch) * k, self.max_new_tokens, generator=generator, dtype=torch.float64)
            texts = self.sample(ids, mask, u, group=k).texts
        finally:
            self.max_new_tokens = cap
        out = [texts[i * k:(i + 1) * k] if k > 1 else texts[i] for i in range(len(batch))]
        return out[0] if single else out

    def predict(self, prompts, deterministic: bool = True, **kwargs):
        """SB3's name for ``generate``: ``deterministic=True`` decodes greedily, else samples."""
        return self.generate(prompts, greedy=deterministic, **kwargs)
