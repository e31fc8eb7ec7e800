"""Resolve a model name, detect its checkpoint family, and load model + tokenizer + special ids."""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import torch
from transformers import AutoTokenizer, PreTrainedTokenizerBase, PreTrainedTokenizerFast

from engine.layers.fp8 import FP8
from engine.layers.quantization import fp8_scheme
from engine.models.batch_invariance import configure_cuda_batch_invariance
from engine.models.checkpoint import load_weights, read_json
from engine.models.families import Family, detect_family
from engine.models.layout import RowLayout
from engine.models.options import ModelOptions
from engine.models.transformer import BidirectionalTransformer
from engine.parallel.shard import TensorShard

TINY_MODEL_DIR = Path(__file__).resolve().parents[2] / "assets" / "tiny"
DTYPES = {"float32": torch.float32, "float64": torch.float64, "bfloat16": torch.bfloat16,
          "float16": torch.float16, "bf16": torch.bfloat16, "fp16": torch.float16,
          "fp32": torch.float32}


@dataclass(frozen=True)
class SpecialTokenIds:
    mask_id: int
    eos_id: int
    pad_id: int
    stop_ids: tuple[int, ...]  # EOS and end-of-turn: a committed one ends the request


@dataclass(frozen=True)
class ModelSource:
    """What :func:`load_model` was given, so another process loads the same checkpoint the same way."""

    model: str  # the checkpoint's directory
    device: str
    dtype: torch.dtype
    options: ModelOptions
    quantization: str | None = None  # load_model's: "fp8" quantizes an unquantized checkpoint at load


@dataclass
class DiffusionLM:
    """A loaded checkpoint: the transformer plus everything the engine must know about its family."""

    name: str
    family: str
    model: BidirectionalTransformer
    tokenizer: PreTrainedTokenizerBase
    special_ids: SpecialTokenIds
    layout: RowLayout  # how its rows are laid out and attended
    max_length: int  # longest row (prompt + canvas) the model accepts
    generation_settings: dict = field(default_factory=dict)  # its generation_config.json, flat, with the
    # settings its family reads from config.json for rules (Family.rule_settings): the rules take the unset
    # settings they own from it (DecodingRule.settle)
    decoding_defaults: dict = field(default_factory=dict)  # the block_length, threshold and gen_length its
    # generation_config.json names: what it decodes with unless the EngineConfig sets them
    image_token_ids: tuple[int, ...] = ()  # ids only an image request carries: refused (text-only families)
    source: ModelSource | None = None  # how it was loaded: a split model's other ranks load the same way

    @property
    def shard(self) -> TensorShard:
        """The rank this model is one share of (size 1: the whole model)."""
        return getattr(self.model.config, "shard", TensorShard())

    @property
    def logit_shift(self) -> int:
        """The hidden state at column c predicts the token at column c + logit_shift."""
        return self.layout.logit_shift

    @property
    def row_kind(self) -> str:
        return self.layout.row_kind

    @property
    def block_length(self) -> int | None:
        """The block size a block-causal model was trained with (None: full attention)."""
        return self.layout.trained_block

    @property
    def options(self) -> ModelOptions:
        """How the model runs its forwards (compiled, batch-invariant): set by the loader, read by engines."""
        return self.model.options

    @property
    def device(self) -> torch.device:
        return self.model.embed_tokens.weight.device

    @property
    def dtype(self) -> torch.dtype:
        return self.model.embed_tokens.weight.dtype

    @property
    def quantization(self) -> str | None:
        """``"fp8"`` when some weights are FP8 (an FP8 checkpoint, or quantized at load), else None."""
        return "fp8" if any(p.dtype == FP8 for p in self.model.parameters()) else None

    @property
    def vocab_size(self) -> int:
        return self.model.config.vocab_size


def resolve_dtype(dtype: str | torch.dtype) -> torch.dtype:
    if isinstance(dtype, torch.dtype):
        return dtype
    if dtype not in DTYPES:
        raise ValueError(f"dtype must be one of {sorted(DTYPES)}, got {dtype!r}")
    return DTYPES[dtype]


def resolve_model_dir(model: str | Path, weights: bool = True) -> Path:
    """``"tiny"`` -> the shipped model; an existing directory -> itself; ``org/name`` -> the hub (with
    ``weights=False``, its config and tokenizer files only)."""
    if str(model) == "tiny":
        return TINY_MODEL_DIR
    path = Path(model).expanduser()
    if path.is_dir():
        if not (path / "config.json").is_file():
            raise ValueError(f"model directory {path} has no config.json")
        return path
    looks_like_hub_id = str(model).count("/") == 1 and not str(model).startswith((".", "/", "~"))
    if not looks_like_hub_id:
        raise ValueError(f"unknown model {str(model)!r}: not 'tiny', not a directory, not a hub id")
    try:
        from huggingface_hub import snapshot_download

        return Path(snapshot_download(
            str(model), allow_patterns=["*.json", "*.jinja", "*.model", "*.txt"] + ["*.safetensors"] * weights))
    except Exception as error:  # any hub failure (offline, unknown repo) is the same user problem
        raise ValueError(
            f"model {str(model)!r} is not a local directory and could not be fetched from the "
            f"Hugging Face hub ({type(error).__name__}: {error}); pass a local checkpoint path") from error


def check_checkpoint(model: str | Path) -> Path:
    """The directory of ``model``'s config and tokenizer files, reading no weights; the loader's own ValueError
    for a model no engine could load: a bad path, a hub id that cannot be fetched, no served family."""
    directory = resolve_model_dir(model, weights=False)
    detect_family(read_json(directory / "config.json"), directory)
    return directory


def load_tokenizer(directory: Path) -> PreTrainedTokenizerBase:
    """A ``tokenizer.json`` loads as a plain fast tokenizer (LLaDA's class; Dream names a remote-code
    class whose vocabulary is that same file); otherwise whatever AutoTokenizer finds, no remote code."""
    if (directory / "tokenizer.json").is_file():
        return PreTrainedTokenizerFast.from_pretrained(str(directory))
    return AutoTokenizer.from_pretrained(str(directory), trust_remote_code=False)


def mask_token_id(config: dict, tokenizer_config: dict, token_id, family: Family) -> int | None:
    """config.json's ``mask_token_id``; else tokenizer_config.json's ``mask_token`` (SDAR spells it
    ``<MASK>`` elsewhere, ``<|MASK|>`` there); else the family's mask token; else the family's known
    id (LLaDA2's release id), if the vocabulary has it."""
    if config.get("mask_token_id") is not None:
        return config["mask_token_id"]
    named = tokenizer_config.get("mask_token")
    named = named.get("content") if isinstance(named, dict) else named
    for token in (named, family.mask_token):
        if token and token_id(token) is not None:
            return token_id(token)
    fallback = family.mask_token_id
    return fallback if fallback is not None and fallback < config.get("vocab_size", 0) else None


def special_token_ids(config: dict, generation_config: dict, tokenizer: PreTrainedTokenizerBase,
                   family: Family, tokenizer_config: dict | None = None) -> SpecialTokenIds:
    def token_id(token: str) -> int | None:
        found = tokenizer.convert_tokens_to_ids(token)
        return found if isinstance(found, int) and found != tokenizer.unk_token_id else None

    mask_id = mask_token_id(config, tokenizer_config or {}, token_id, family)
    text_config = config.get("text_config") or {}  # DiffusionGemma keeps its ids with its text stack
    eos_id = config.get("eos_token_id", text_config.get("eos_token_id", tokenizer.eos_token_id))
    if isinstance(eos_id, list):
        eos_id = eos_id[0]
    pad_id = config.get("pad_token_id", text_config.get("pad_token_id", tokenizer.pad_token_id))
    if mask_id is None or eos_id is None:
        raise ValueError("checkpoint config names no mask_token_id / eos_token_id")
    stops = {eos_id}
    generation_eos = generation_config.get("eos_token_id", [])
    stops.update(generation_eos if isinstance(generation_eos, list) else [generation_eos])
    end_of_turn = token_id(family.end_of_turn_token)
    if end_of_turn is not None:
        stops.add(end_of_turn)
    return SpecialTokenIds(mask_id=mask_id, eos_id=eos_id, pad_id=eos_id if pad_id is None else pad_id,
                         stop_ids=tuple(sorted(stops)))


def apply_model_options(transformer: BidirectionalTransformer, options: ModelOptions) -> None:
    """Run ``transformer`` with ``options`` (with ``batch_invariant`` on CUDA, also the process-wide
    cuBLAS settings). Done once, on the device it stays on, before any engine runs it: every engine
    that shares the model object runs it so."""
    transformer.apply_options(options)
    if options.batch_invariant and transformer.embed_tokens.weight.device.type == "cuda":
        configure_cuda_batch_invariance()


def load_model(model: str | Path, device: str | torch.device = "cpu", dtype: str | torch.dtype = "float32",
               compile: bool = False, batch_invariant: bool = False, tensor_parallel_size: int = 1,
               rank: int = 0, quantization: str | None = None) -> DiffusionLM:
    """The checkpoint ``model`` on ``device`` in ``dtype``, run with the :class:`ModelOptions` ``compile``
    and ``batch_invariant`` by every engine it is given to (on CUDA, ``batch_invariant`` also applies
    process-wide cuBLAS settings: ``engine.models.batch_invariance``). With ``tensor_parallel_size`` N > 1,
    rank ``rank``'s share of it: an engine with ``tensor_parallel_size=N`` loads the other ranks itself. A
    checkpoint with an FP8-dynamic ``quantization_config`` loads FP8 weights; ``quantization="fp8"`` quantizes
    an unquantized one at load the same way (``engine.layers.quantization``)."""
    options = ModelOptions(compile=compile, batch_invariant=batch_invariant)
    shard = TensorShard(rank, tensor_parallel_size)
    directory = resolve_model_dir(model)
    config = read_json(directory / "config.json")
    family = detect_family(config, directory)
    layout = family.layout(config)  # a layout the engine would decode wrongly is refused here
    fp8 = fp8_scheme(config, quantization, str(directory / "config.json"))
    transformer_config = family.transformer_config(config).rank_share(shard)
    with torch.device("meta"):
        transformer = (family.model_class or BidirectionalTransformer)(transformer_config)
    load_weights(transformer, directory, family.weight_names.ours, torch.device(device), resolve_dtype(dtype), shard,
                 fp8, family.weight_names.theirs_of)
    transformer.eval().requires_grad_(False)
    apply_model_options(transformer, options)
    tokenizer = load_tokenizer(directory)
    generation_config = read_json(directory / "generation_config.json")
    special_ids = special_token_ids(config, generation_config, tokenizer, family,
                                    read_json(directory / "tokenizer_config.json"))
    return DiffusionLM(name=str(model), family=family.name, model=transformer, tokenizer=tokenizer,
                       special_ids=special_ids, layout=layout, max_length=transformer_config.max_position_embeddings,
                       generation_settings=generation_settings(generation_config) | (
                           family.rule_settings(config) if family.rule_settings else {}),
                       decoding_defaults=decoding_defaults(generation_config, directory),
                       image_token_ids=family.image_tokens(config) if family.image_tokens else (),
                       source=ModelSource(str(directory), str(device), resolve_dtype(dtype), options, quantization))


DECODING_DEFAULTS = {"block_length": (int, "a positive int"), "gen_length": (int, "a positive int"),
                     "threshold": (float, "a number in (0, 1]")}  # generation_config.json keys -> type, what


def decoding_defaults(generation_config: dict, directory: Path) -> dict:
    """The decoding settings a checkpoint's generation_config.json names (``DECODING_DEFAULTS``); a value of the
    wrong kind is refused at load, naming the file and the key."""
    settings = {key: generation_config[key] for key in DECODING_DEFAULTS if generation_config.get(key) is not None}
    for key, value in settings.items():
        kind, what = DECODING_DEFAULTS[key]
        number = isinstance(value, (int, float)) and not isinstance(value, bool)
        valid = (isinstance(value, int) and not isinstance(value, bool) and value > 0) if kind is int else (
            number and 0.0 < value <= 1.0)
        if not valid:
            raise ValueError(f"{directory / 'generation_config.json'}: {key} must be {what}, got {value!r}")
    return settings


def generation_settings(generation_config: dict) -> dict:
    """A generation_config.json's settings, flat: a nested ``sampler_config`` (DiffusionGemma keeps a sampler
    setting there) joins the top level and wins a clash; unset (null) values are left out."""
    flat = {key: value for key, value in generation_config.items() if key != "sampler_config"}
    return {key: value for key, value in (flat | (generation_config.get("sampler_config") or {})).items()
            if value is not None}
