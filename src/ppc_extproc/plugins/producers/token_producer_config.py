"""Parameters of ``token-producer``, with llm-d's names, defaults and errors.

Follows ``llm-d/llm-d-router: pkg/epp/framework/plugins/requestcontrol/dataproducer/tokenizer/tokenizer.go``
(backend selection) and ``estimate.go`` / ``mm_estimate.go`` (the estimate parameters).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from ppc_extproc.errors import ConfigError
from ppc_extproc.framework.params import Section
from ppc_extproc.tokenizer.estimate import EstimateConfig, ImageEstimate, VideoEstimate
from ppc_extproc.tokenizer.render_client import RenderConfig

__all__ = ["DEFAULT_RENDER_URL", "LocalConfig", "TokenProducerConfig", "parse_token_producer_config"]

DEFAULT_RENDER_URL = "http://localhost:8000"
DEFAULT_SEGMENT_CACHE_BYTES = 256 * 1024 * 1024
DEFAULT_RENDER_CONCURRENCY = 256
_OWNER = "token-producer"


@dataclass(frozen=True, slots=True)
class LocalConfig:
    """The ``local`` backend: the model's tokenizer and chat template, in process."""

    tokenizer_path: str
    #: Bytes of tokenized text pieces kept for reuse (shared prefixes are tokenized once).
    segment_cache_bytes: int = DEFAULT_SEGMENT_CACHE_BYTES


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
    if not url.startswith("http://"):
        raise ConfigError(section.child_path("url"), "must be a plain http:// URL (llm-d's render client has no TLS)")
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


def parse_token_producer_config(params: Section) -> TokenProducerConfig:
    """Decode the parameters (the caller runs ``params.finish()``). llm-d allows one of
    ``estimate``, ``vllm`` and ``udsTokenizerConfig``; ``local`` may add ``vllm`` for what only a
    render server can tokenize (multimodal parts, Responses bodies)."""
    model_name = params.string("modelName", "")
    uds = params.section("udsTokenizerConfig")
    uds_socket = uds.string("socketFile", "")
    uds.boolean("useTCP", False)
    uds.raw("modelTokenizerMap")
    uds.finish()
    chosen = [key for key in ("estimate", "vllm") if params.has(key)] + (["udsTokenizerConfig"] if uds_socket else [])
    local = params.has("local")
    if len(chosen) > 1 or (local and ("estimate" in chosen or uds_socket)):
        raise ConfigError(params.path, "only one of 'estimate', 'vllm', or 'udsTokenizerConfig' may be set "
                                       "('local' may be combined with 'vllm')")  # fmt: skip
    if uds_socket:
        raise ConfigError(
            params.child_path("udsTokenizerConfig"),
            "udsTokenizerConfig (deprecated UDS tokenizer) is not supported; use local.tokenizerPath or vllm.url",
        )
    estimate = EstimateConfig()
    if "estimate" in chosen:
        section = params.section("estimate")
        estimate = EstimateConfig(_image(section.section("image")), _video(section.section("video")))
        section.finish()
    if local:
        section = params.section("local")
        path = section.string("tokenizerPath", "")
        if not path:
            raise ConfigError(section.child_path("tokenizerPath"), "the local backend needs the tokenizer's directory")
        local_config = LocalConfig(path, section.integer("segmentCacheBytes", DEFAULT_SEGMENT_CACHE_BYTES, minimum=0))
        section.finish()
        render = _render(params, model_name) if "vllm" in chosen else None
        return TokenProducerConfig("local", model_name, render=render, local=local_config, estimate=estimate)
    if "vllm" in chosen or model_name:
        return TokenProducerConfig("vllm", model_name, render=_render(params, model_name), estimate=estimate)
    return TokenProducerConfig("estimate", model_name, estimate=estimate)
