"""Model folders as both sides read them: the processor (or tokenizer), its image tokens, clear errors."""
from __future__ import annotations

from pathlib import Path


def load_processor(model_path: str | Path):
    """The model's processor when it has one (vision-language), otherwise its tokenizer."""
    from transformers import AutoProcessor, AutoTokenizer

    path = check_model_dir(model_path)
    if (path / "processor_config.json").is_file() or (path / "preprocessor_config.json").is_file():
        return AutoProcessor.from_pretrained(path)
    return AutoTokenizer.from_pretrained(path)


def check_model_dir(model_path: str | Path) -> Path:
    path = Path(model_path)
    if not path.is_dir():
        raise FileNotFoundError(
            f"model folder {str(path)!r} does not exist: pass the path of a local Hugging Face model folder "
            "(config.json + weights), e.g. one built by `python -m grpo.tools.tiny_models --out DIR`")
    if not (path / "config.json").is_file():
        raise ValueError(
            f"model folder {str(path)!r} has no config.json, so it is not a Hugging Face model: point the "
            "model path at the folder that `save_pretrained` wrote")
    return path


def tokenizer_of(processor):
    return getattr(processor, "tokenizer", processor)


def image_token_id(processor) -> int | None:
    return getattr(processor, "image_token_id", None)


def image_token_counts(processor, image_grid_thw) -> list[int]:
    """How many placeholders each image takes once expanded: one per merged patch, as vLLM expands them.

    image_grid_thw: the image processor's [N, 3] grid (temporal, height, width patches) of N images.
    """
    merge = processor.image_processor.merge_size
    return (image_grid_thw.prod(-1) // (merge * merge)).tolist()


VISION_TOKENS = ("<|vision_start|>", "<|vision_end|>", "<|image_pad|>", "<|video_pad|>")


def vision_token_ids(processor) -> tuple[int, ...]:
    """Ids that mark images and videos in the sequence; the policy never samples them (see token_logprobs)."""
    tok = tokenizer_of(processor)
    ids = {image_token_id(processor)}
    for t in VISION_TOKENS:
        i = tok.convert_tokens_to_ids(t)
        if isinstance(i, int) and i >= 0 and i != tok.unk_token_id:
            ids.add(i)
    ids.discard(None)
    return tuple(sorted(ids))
