"""Parameters of ``token-producer``, with llm-d's names, defaults and errors.

Follows ``llm-d/llm-d-router: pkg/epp/framework/plugins/requestcontrol/dataproducer/tokenizer/tokenizer.go``
(backend selection) and ``estimate.go`` / ``mm_estimate.go`` (the estimate parameters).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from ppc_extproc.config.strict import Section
from ppc_extproc.errors import ConfigError

__all__ = [
    "DEFAULT_RENDER_URL",
    "EstimateConfig",
    "ImageEstimate",
    "LocalConfig",
    "RenderConfig",
    "TokenProducerConfig",
    "VideoEstimate",
    "parse_token_producer_config",
]

DEFAULT_RENDER_URL = "http://localhost:8000"
DEFAULT_SEGMENT_CACHE_BYTES = 256 * 1024 * 1024
DEFAULT_RENDER_CONCURRENCY = 64
_OWNER = "token-producer"


@dataclass(frozen=True, slots=True)
class RenderConfig:
    """The ``vllm`` backend: vLLM's render endpoints over HTTP."""

    url: str = DEFAULT_RENDER_URL
    #: Text-only requests.
    timeout_seconds: float = 5.0
    #: Requests whose message content is an array (multimodal, even text-only parts).
    mm_timeout_seconds: float = 30.0
    #: Renders in flight at once (ppc-extproc; bounds the load a slow renderer sees).
    max_concurrency: int = DEFAULT_RENDER_CONCURRENCY


@dataclass(frozen=True, slots=True)
class LocalConfig:
    """The ``local`` backend: the model's tokenizer and chat template, in process."""

    tokenizer_path: str
    #: Bytes of tokenized text pieces kept for reuse (shared prefixes are tokenized once).
    segment_cache_bytes: int = DEFAULT_SEGMENT_CACHE_BYTES


@dataclass(frozen=True, slots=True)
class ImageEstimate:
    mode: str = "dynamic"
    default_width: int = 640
    default_height: int = 360
    dynamic_factor: int = 1024
    static_token: int = 1


@dataclass(frozen=True, slots=True)
class VideoEstimate:
    default_width: int = 640
    default_height: int = 360
    default_duration_seconds: float = 10.0
    max_video_tokens: int = 0
    tokens_per_frame_mode: str = "dynamic"
    tokens_per_frame_factor: int = 1024
    tokens_per_frame_static: int = 1
    frames_mode: str = "sampled"
    min_frames: int = 0
    max_frames: int = 0
    sample_fps: float = 2.0
    temporal_patch_size: int = 1
    default_source_fps: float = 24.0
    frame_stride: int = 1


@dataclass(frozen=True, slots=True)
class EstimateConfig:
    """The ``estimate`` backend: llm-d's byte packing (about 4 bytes per pseudo-token)."""

    image: ImageEstimate = field(default_factory=ImageEstimate)
    video: VideoEstimate = field(default_factory=VideoEstimate)


@dataclass(frozen=True, slots=True)
class TokenProducerConfig:
    #: ``local``, ``vllm`` or ``estimate``.
    backend: str
    #: The served model name render calls carry in place of the request's ``model``.
    model_name: str = ""
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
    return ImageEstimate(mode, width, height, factor, token)


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
    patch = sampled.integer("temporalPatchSize", 1, minimum=1)
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
        tokens_per_frame_mode=tpf_mode,
        tokens_per_frame_factor=tpf_factor,
        tokens_per_frame_static=tpf_tokens,
        frames_mode=frames_mode,
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


def parse_token_producer_config(params: Section) -> TokenProducerConfig:
    """Decode the parameters (the caller runs ``params.finish()``)."""
    model_name = params.string("modelName", "")
    chosen = [key for key in ("estimate", "vllm", "local") if params.has(key)]
    uds = params.section("udsTokenizerConfig")
    uds_socket = uds.string("socketFile", "")
    uds.boolean("useTCP", False)
    uds.raw("modelTokenizerMap")
    uds.finish()
    if uds_socket:
        chosen.append("udsTokenizerConfig")
    if len(chosen) > 1:
        raise ConfigError(
            params.path, "only one of 'estimate', 'vllm', 'local', or 'udsTokenizerConfig' may be set"
        )
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
    if "local" in chosen:
        section = params.section("local")
        path = section.string("tokenizerPath", "")
        if not path:
            raise ConfigError(section.child_path("tokenizerPath"), "the local backend needs the tokenizer's directory")
        local = LocalConfig(path, section.integer("segmentCacheBytes", DEFAULT_SEGMENT_CACHE_BYTES, minimum=0))
        section.finish()
        return TokenProducerConfig("local", model_name, local=local, estimate=estimate)
    if "vllm" in chosen or model_name:
        if not model_name:
            raise ConfigError(params.child_path("modelName"), "'modelName' must be specified")
        section = params.section("vllm")
        url = (section.string("url", DEFAULT_RENDER_URL) or DEFAULT_RENDER_URL).rstrip("/")
        if not url.startswith("http://"):
            raise ConfigError(section.child_path("url"), "must be a plain http:// URL (llm-d's render client has no TLS)")
        timeouts = []
        for key, default, label in (("timeout", "5s", "timeout"), ("mmTimeout", "30s", "mmTimeout")):
            try:
                value = section.duration(key, default)
            except ConfigError:
                raise ConfigError(section.child_path(key), f"invalid '{label}'") from None
            if value <= 0:
                raise ConfigError(section.child_path(key), f"invalid '{label}': must be positive")
            timeouts.append(value)
        render = RenderConfig(url, timeouts[0], timeouts[1],
                              section.integer("maxConcurrency", DEFAULT_RENDER_CONCURRENCY, minimum=1))  # fmt: skip
        section.finish()
        return TokenProducerConfig("vllm", model_name, render=render, estimate=estimate)
    return TokenProducerConfig("estimate", model_name, estimate=estimate)
