"""Parameters of ``token-producer``, with llm-d's names, defaults and errors.

Follows ``llm-d/llm-d-router: pkg/epp/framework/plugins/requestcontrol/dataproducer/tokenizer/tokenizer.go``
(backend selection) and ``estimate.go`` / ``mm_estimate.go`` (the estimate parameters).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ppc_extproc.errors import ConfigError
from ppc_extproc.framework.params import Section
from ppc_extproc.tokenizer.estimate import EstimateConfig, ImageEstimate, VideoEstimate
from ppc_extproc.tokenizer.render_client import RenderConfig

__all__ = [
    "DEFAULT_RENDER_URL",
    "LocalConfig",
    "TokenProducerConfig",
    "parse_token_producer_config",
    "pool_config_to_params",
]

DEFAULT_RENDER_URL = "http://localhost:8000"
DEFAULT_SEGMENT_CACHE_BYTES = 256 * 1024 * 1024
DEFAULT_RENDER_CONCURRENCY = 256
_OWNER = "token-producer"


@dataclass(frozen=True, slots=True)
class LocalConfig:
    """The ``local`` backend: each model's tokenizer and chat template, in process.

    A model's tokenizer is ``tokenizers[model]``, else ``tokenizer_path``, else found in
    ``cache_dirs`` or the Hugging Face hub cache; else its engines render it (``engine_render``).
    """

    #: ``local.tokenizerPath``: the tokenizer directory for every model not in ``tokenizers``.
    tokenizer_path: str = ""
    #: ``local.tokenizers``: served model name → tokenizer directory (or its ``tokenizer.json``).
    tokenizers: Mapping[str, str] = field(default_factory=dict)
    #: ``local.cacheDirs``: directories holding ``<org>/<name>/`` or ``models--org--name`` trees.
    cache_dirs: tuple[str, ...] = ()
    #: ``local.huggingFaceCache``: read the hub cache (``HF_HUB_CACHE``, ``HF_HOME/hub``, ``~/.cache``).
    hf_cache: bool = True
    #: ``local.engineRender``: without a tokenizer on disk, ask the request's engines to render.
    engine_render: bool = True
    #: ``local.chatTemplate``: the file the engines' ``--chat-template`` names.
    chat_template_path: str = ""
    #: ``local.defaultChatTemplateKwargs``: the engines' ``--default-chat-template-kwargs``.
    default_chat_template_kwargs: Mapping[str, Any] = field(default_factory=dict)
    #: ``local.trustRequestChatTemplate``: the engines' ``--trust-request-chat-template``.
    trust_request_chat_template: bool = False
    #: Bytes of tokenized text pieces kept for reuse (shared prefixes are tokenized once).
    segment_cache_bytes: int = DEFAULT_SEGMENT_CACHE_BYTES
    #: Models remembered (names come from clients) and tokenizers kept loaded.
    max_models: int = 256
    max_loaded: int = 8


@dataclass(frozen=True, slots=True)
class TokenProducerConfig:
    #: ``local``, ``vllm`` or ``estimate``.
    backend: str
    #: The served model name render calls carry in place of the request's ``model``.
    model_name: str = ""
    #: The ``vllm`` backend, or (with ``local``) where multimodal requests are rendered.
    render: RenderConfig | None = None
    local: LocalConfig | None = None
    estimate: EstimateConfig = field(default_factory=EstimateConfig)


def _mode(section: Section, key: str, default: str, choices: tuple[str, str], what: str) -> str:
    value = section.string(key, default) or default
    if value not in choices:
        raise ConfigError(section.child_path(key), f'{what} must be "{choices[0]}" or "{choices[1]}"')
    return value


def _resolution(section: Section, default: tuple[int, int]) -> tuple[int, int]:
    res = section.section("defaultResolution")
    width = res.integer("width", default[0], minimum=1)
    height = res.integer("height", default[1], minimum=1)
    res.finish()
    return width, height


def _image(section: Section) -> ImageEstimate:
    mode = _mode(section, "mode", "dynamic", ("dynamic", "static"), "estimate.image.mode")
    width, height = _resolution(section, (640, 360))
    dynamic = section.section("dynamic")
    factor = dynamic.integer("factor", 1024, minimum=1)
    dynamic.finish()
    static = section.section("static")
    token = static.integer("staticToken", 1, minimum=1)
    static.finish()
    section.finish()
    return ImageEstimate(mode, width, height, factor, token)  # type: ignore[arg-type]


def _video(section: Section) -> VideoEstimate:
    width, height = _resolution(section, (640, 360))
    per_frame = section.section("tokensPerFrame")
    tpf_mode = _mode(per_frame, "mode", "dynamic", ("dynamic", "static"), "estimate.video.tokensPerFrame.mode")
    tpf_dynamic = per_frame.section("dynamic")
    tpf_factor = tpf_dynamic.integer("factor", 1024, minimum=1)
    tpf_dynamic.finish()
    tpf_static = per_frame.section("static")
    tpf_tokens = tpf_static.integer("numTokensPerFrame", 1, minimum=1)
    tpf_static.finish()
    per_frame.finish()
    frames = section.section("frames")
    frames_mode = _mode(frames, "mode", "sampled", ("sampled", "strided"), "estimate.video.frames.mode")
    sampled = frames.section("sampled")
    sample_fps = sampled.number("sampleFPS", 2.0, minimum=0.0)
    patch = sampled.integer("temporalPatchSize", 0, minimum=0)
    sampled.finish()
    strided = frames.section("strided")
    source_fps = strided.number("defaultSourceFPS", 24.0, minimum=0.0)
    stride = strided.integer("frameStride", 1, minimum=1)
    strided.finish()
    config = VideoEstimate(
        default_width=width,
        default_height=height,
        default_duration_seconds=section.number("defaultDuration", 10.0, minimum=0.0),
        max_video_tokens=section.integer("maxVideoTokens", 0, minimum=0),
        tpf_mode=tpf_mode,  # type: ignore[arg-type]
        tpf_factor=tpf_factor,
        tpf_static=tpf_tokens,
        frames_mode=frames_mode,  # type: ignore[arg-type]
        min_frames=frames.integer("minFrames", 0, minimum=0),
        max_frames=frames.integer("maxFrames", 0, minimum=0),
        sample_fps=sample_fps,
        temporal_patch_size=patch,
        default_source_fps=source_fps,
        frame_stride=stride,
    )
    frames.finish()
    section.finish()
    return config


def _render(params: Section, model_name: str) -> RenderConfig:
    if not model_name:
        raise ConfigError(params.child_path("modelName"), "'modelName' must be specified")
    section = params.section("vllm")
    url = (section.string("url", DEFAULT_RENDER_URL) or DEFAULT_RENDER_URL).rstrip("/")
    scheme, sep, host = url.partition("://")
    if scheme not in ("http", "https") or not sep or not host:
        raise ConfigError(section.child_path("url"), "must be an http:// or https:// URL")
    timeouts = []
    for key, default in (("timeout", "5s"), ("mmTimeout", "30s")):
        try:
            value = section.duration(key, default)
        except ConfigError:
            raise ConfigError(section.child_path(key), f"invalid '{key}'") from None
        if value <= 0:
            raise ConfigError(section.child_path(key), f"invalid '{key}': must be positive")
        timeouts.append(value)
    concurrency = section.integer("maxConcurrency", DEFAULT_RENDER_CONCURRENCY, minimum=1)
    section.finish()
    return RenderConfig(model_name, url, timeouts[0], timeouts[1], max_concurrency=concurrency,
                        stall_seconds=min(1.0, timeouts[0]))  # fmt: skip


def _string_map(section: Section, key: str) -> dict[str, str]:
    raw = section.raw(key, {})
    if not isinstance(raw, dict) or not all(isinstance(k, str) and isinstance(v, str) and v for k, v in raw.items()):
        raise ConfigError(section.child_path(key), "expected a mapping of model name to tokenizer directory")
    return dict(raw)


def _local(section: Section) -> LocalConfig:
    dirs = []
    for path, item in section.items("cacheDirs"):
        if not isinstance(item, str) or not item:
            raise ConfigError(path, "expected a directory")
        dirs.append(item)
    kwargs = section.raw("defaultChatTemplateKwargs", {})
    if not isinstance(kwargs, dict):
        raise ConfigError(section.child_path("defaultChatTemplateKwargs"), "expected a mapping (as --default-chat-template-kwargs)")
    template = section.string("chatTemplate", "")
    if template and not Path(template).expanduser().is_file():
        raise ConfigError(section.child_path("chatTemplate"), f"{template}: no such file (the engines' --chat-template)")
    config = LocalConfig(
        tokenizer_path=section.string("tokenizerPath", ""),
        tokenizers=_string_map(section, "tokenizers"),
        cache_dirs=tuple(dirs),
        hf_cache=section.boolean("huggingFaceCache", True),
        engine_render=section.boolean("engineRender", True),
        chat_template_path=template,
        default_chat_template_kwargs=kwargs,
        trust_request_chat_template=section.boolean("trustRequestChatTemplate", False),
        segment_cache_bytes=section.integer("segmentCacheBytes", DEFAULT_SEGMENT_CACHE_BYTES, minimum=0),
        max_models=section.integer("maxModels", 256, minimum=1),
        max_loaded=section.integer("maxLoadedTokenizers", 8, minimum=1),
    )
    section.finish()
    return config


def _uds_local(uds: Section, params: Section, tokenizer_map: Any) -> dict[str, Any]:
    params.warn(
        "udsTokenizerConfig", "DEPRECATION: the 'udsTokenizerConfig' parameter is deprecated (llm-d v0.9); ppc-extproc "
        "has no UDS tokenizer client and tokenizes in process instead (modelTokenizerMap, the Hugging Face cache, "
        "the engines' render endpoints); set 'local' or 'vllm'",
    )
    if tokenizer_map is not None and not (isinstance(tokenizer_map, dict) and all(isinstance(v, str) for v in tokenizer_map.values())):
        raise ConfigError(uds.child_path("modelTokenizerMap"), "expected a mapping of model name to tokenizer path")
    return {"tokenizers": dict(tokenizer_map or {})}


def parse_token_producer_config(params: Section) -> TokenProducerConfig:
    """Decode the parameters (the caller runs ``params.finish()``). llm-d allows one of
    ``estimate``, ``vllm`` and ``udsTokenizerConfig``; ``local`` may add ``vllm`` for what only a
    render server can tokenize (multimodal parts, Responses bodies). The deprecated
    ``udsTokenizerConfig`` loads as ``local`` with its ``modelTokenizerMap``."""
    model_name = params.string("modelName", "")
    uds = params.section("udsTokenizerConfig")
    uds_socket = uds.string("socketFile", "")
    uds.boolean("useTCP", False)
    tokenizer_map = uds.raw("modelTokenizerMap")
    for ignored in ("huggingFaceToken", "tokenizersCacheDir"):
        uds.raw(ignored)
    uds.finish()
    chosen = [key for key in ("estimate", "vllm") if params.has(key)] + (["udsTokenizerConfig"] if uds_socket else [])
    local = params.has("local") or "local" in params.data  # `local:` with nothing under it is `local: {}`
    if len(chosen) > 1 or (local and ("estimate" in chosen or uds_socket)):
        raise ConfigError(params.path, "only one of 'estimate', 'vllm', or 'udsTokenizerConfig' may be set "
                                       "('local' may be combined with 'vllm')")  # fmt: skip
    if uds_socket:
        if not model_name:
            raise ConfigError(params.child_path("modelName"), "'modelName' must be specified")
        local_config = _local(params.sub(_uds_local(uds, params, tokenizer_map), params.child_path("udsTokenizerConfig")))
        return TokenProducerConfig("local", model_name, local=local_config)
    estimate = EstimateConfig()
    if "estimate" in chosen:
        section = params.section("estimate")
        estimate = EstimateConfig(_image(section.section("image")), _video(section.section("video")))
        section.finish()
    if local:
        local_config = _local(params.section("local"))
        render = _render(params, model_name) if "vllm" in chosen else None
        return TokenProducerConfig("local", model_name, render=render, local=local_config, estimate=estimate)
    if "vllm" in chosen or model_name:
        return TokenProducerConfig("vllm", model_name, render=_render(params, model_name), estimate=estimate)
    return TokenProducerConfig("estimate", model_name, estimate=estimate)


def pool_config_to_params(pool: Any, path: str) -> dict[str, Any]:
    """The ``token-producer`` parameters equivalent to a legacy ``tokenizersPoolConfig``
    (``llm-d/llm-d-kv-cache: pkg/tokenization/pool.go`` ``Config``): ``local.modelTokenizerMap`` →
    ``local.tokenizers``; ``local.autoDiscoveryDir`` and ``hf.tokenizersCacheDir`` → ``local.cacheDirs``;
    ``uds`` as ``udsTokenizerConfig``. Workers, overlap ratio and Hugging Face tokens have no use
    here (nothing is downloaded)."""
    if pool is None:
        pool = {}
    if not isinstance(pool, dict):
        raise ConfigError(path, "expected a mapping")
    local: dict[str, Any] = {}
    tokenizers: dict[str, str] = {}
    dirs: list[str] = []
    for key, value in (("local", pool.get("local")), ("uds", pool.get("uds"))):
        if isinstance(value, dict) and isinstance(value.get("modelTokenizerMap"), dict):
            tokenizers.update({str(k): str(v) for k, v in value["modelTokenizerMap"].items()})
        if key == "local" and isinstance(value, dict) and isinstance(value.get("autoDiscoveryDir"), str):
            dirs.append(value["autoDiscoveryDir"])
    hf = pool.get("hf")
    if isinstance(hf, dict) and isinstance(hf.get("tokenizersCacheDir"), str) and hf["tokenizersCacheDir"]:
        dirs.append(hf["tokenizersCacheDir"])
    if tokenizers:
        local["tokenizers"] = tokenizers
    if dirs:
        local["cacheDirs"] = dirs
    params: dict[str, Any] = {"local": local}
    if isinstance(pool.get("modelName"), str) and pool["modelName"]:
        params["modelName"] = pool["modelName"]
    return params
