"""Model folders as both sides read them: the processor (or tokenizer), its image tokens, clear errors."""
from __future__ import annotations

import json
import re
import sys
from pathlib import Path


def load_processor(model_path: str | Path):
    """The model's processor when it has one (vision-language), otherwise its tokenizer."""
    from transformers import AutoProcessor, AutoTokenizer

    path = check_model_dir(model_path)
    if (path / "processor_config.json").is_file() or (path / "preprocessor_config.json").is_file():
        return AutoProcessor.from_pretrained(path)
    return AutoTokenizer.from_pretrained(path)


def resolve_model(spec: str | Path) -> Path:
    """The local folder a run's `model:` names, which vLLM, the train ranks and `grpo eval` load: a local folder
    as it is; a Hub id (ORG/NAME) that names no local folder, its snapshot folder in the user's Hugging Face
    cache (hub_snapshot); a name from `grpo models list` or a `.gguf` file, the folder it is converted into once
    (rollout.pretrained). The driver calls it once and hands the folder on, so the actors never look it up."""
    from rollout import pretrained

    path = Path(spec)
    if not path.is_dir() and pretrained.is_pretrained_spec(str(spec)):
        return check_model_dir(pretrained.resolve(str(spec), progress=_progress))
    if not path.exists() and is_hub_id(str(spec)):
        path = hub_snapshot(str(spec))
    return check_model_dir(path)


def _progress(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


_HUB_ID = re.compile(r"[A-Za-z0-9][\w.-]{0,95}/[A-Za-z0-9][\w.-]{0,95}")
# Files in model repos that neither vLLM nor transformers loads: a snapshot is downloaded without them (Llama's
# original/ checkpoint alone doubles its size).
_NOT_LOADED = ["original/*", "onnx/*", "openvino/*", "*.gguf", "*.onnx", "*.h5", "*.msgpack", "*.ot", "*.pth"]


def is_hub_id(spec: str) -> bool:
    """ORG/NAME as the Hub spells repository ids (no "--" or "..", which the Hub refuses)."""
    return bool(_HUB_ID.fullmatch(spec)) and "--" not in spec and ".." not in spec


def hub_snapshot(repo_id: str, download: bool = True) -> Path:
    """The snapshot folder of a Hub model in the user's Hugging Face cache ($HF_HOME/hub, with their token),
    downloaded there when missing; with HF_HUB_OFFLINE set or `download` false, only looked up. Failures are
    one line naming the id and what to do."""
    import huggingface_hub
    from huggingface_hub.errors import GatedRepoError, LocalEntryNotFoundError, RepositoryNotFoundError

    offline = huggingface_hub.is_offline_mode()
    try:
        return Path(huggingface_hub.snapshot_download(repo_id, local_files_only=offline or not download,
                                                      ignore_patterns=_NOT_LOADED))
    except (GatedRepoError, RepositoryNotFoundError):
        raise FileNotFoundError(
            f"model {repo_id!r} is neither a local folder nor a Hub model this token may read: check the id; for a "
            "gated or private model, accept its terms on its Hub page and log in (`hf auth login`, or set "
            "HF_TOKEN)") from None
    except LocalEntryNotFoundError:
        cache = huggingface_hub.constants.HF_HUB_CACHE
        why = "HF_HUB_OFFLINE is set" if offline else "the Hub could not be reached" if download else "not downloaded"
        raise FileNotFoundError(
            f"model {repo_id!r} is neither a local folder nor in the Hugging Face cache {cache} ({why}): fetch it "
            f"with `hf download {repo_id}`, or point HF_HOME at a cache that holds it") from None


def check_model_dir(model_path: str | Path) -> Path:
    path = Path(model_path)
    if not path.is_dir():
        raise FileNotFoundError(
            f"model folder {str(path)!r} does not exist: pass the path of a local Hugging Face model folder "
            "(config.json + weights), e.g. one built by `python -m grpo.tools.tiny_models --out DIR`, or a Hub "
            "id (ORG/NAME)")
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


def image_inputs(processor, images: list) -> tuple[dict, list[int]]:
    """The model's image inputs (pixel_values, and image_grid_thw for the Qwen-VL families) and how many
    placeholders each image takes once expanded, as vLLM expands them: one per merged patch (Qwen-VL), else
    the count the family's processor gives for the image's size (LLaVA: one per patch of the cropped image).
    """
    vis = dict(processor.image_processor(images=list(images), return_tensors="pt"))
    if "image_grid_thw" in vis:
        return vis, image_token_counts(processor, vis["image_grid_thw"])
    sizes = [(img.height, img.width) for img in images]
    return vis, list(processor._get_num_multimodal_tokens(image_sizes=sizes).num_image_tokens)


def image_sequences(processor, counts: list[int]) -> list[list[int]]:
    """The ids each image's compact placeholder becomes, as vLLM expands it: the placeholder once per image
    token (Qwen-VL, LLaVA), or Gemma 3's whole image sequence: "\\n\\n<start_of_image>", its soft tokens,
    "<end_of_image>\\n\\n" (newlines then merged with their neighbours: merge_newlines)."""
    full = getattr(processor, "full_image_sequence", None)
    if full is None:
        return [[image_token_id(processor)] * c for c in counts]
    ids = list(tokenizer_of(processor)(full, add_special_tokens=False)["input_ids"])
    return [list(ids) for _ in counts]


def image_length(processor, image) -> int:
    """The tokens one image's placeholder becomes (Gemma 3's newline merges may take one or two off)."""
    return len(image_sequences(processor, image_inputs(processor, [image])[1])[0])


def merge_newlines(processor, ids: list[int]) -> tuple[list[int], list[bool]]:
    """Gemma 3 only, as vLLM's Gemma 3 processor does after expanding: "\\n" and "\\n\\n" tokens side by side
    become the one token the tokenizer has for three or four newlines. Returns the ids and, per id, whether it
    is a merge (a new token that none of the input ids was)."""
    if getattr(processor, "full_image_sequence", None) is None:
        return ids, [False] * len(ids)
    vocab = tokenizer_of(processor).get_vocab()
    n1, n2, n3, n4 = (vocab["\n" * k] for k in (1, 2, 3, 4))
    out, merged = list(ids), [False] * len(ids)
    for pair, into in (((n1, n2), n3), ((n2, n1), n3), ((n2, n2), n4)):
        i, done, flags = 0, [], []
        while i < len(out):
            if i + 1 < len(out) and (out[i], out[i + 1]) == pair:
                done.append(into)
                flags.append(True)
                i += 2
            else:
                done.append(out[i])
                flags.append(merged[i])
                i += 1
        out, merged = done, flags
    return out, merged


VISION_TOKENS = ("<|vision_start|>", "<|vision_end|>", "<|image_pad|>", "<|video_pad|>",  # Qwen-VL
                 "<start_of_image>", "<end_of_image>", "<image_soft_token>")  # Gemma 3


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


def has_sliding_window(text_config) -> bool:
    """Whether some layer of a text model attends over a window only (Gemma 2 and 3; Mistral and Qwen2 when their
    config sets one): its mask is more than causal, and its key-value cache keeps only the window."""
    return "sliding_attention" in (getattr(text_config, "layer_types", None) or ()) or bool(
        getattr(text_config, "sliding_window", None) and getattr(text_config, "use_sliding_window", True))


# Architectures whose served logprobs the trainer does not reproduce on a device, and why (docs/models.md).
NOT_EXACT = {
    ("Gemma3ForConditionalGeneration", "cuda"): "vLLM's GPU attention attends Gemma 3's image tokens "
    "bidirectionally while the trainer attends them causally (it passes no token_type_ids)",
}


def check_exact(model_path: str | Path, device: str) -> None:
    """Refuse a model the trainer would score differently from what vLLM samples on `device`."""
    config = json.loads((check_model_dir(model_path) / "config.json").read_text())
    for arch in config.get("architectures") or ():
        why = NOT_EXACT.get((arch, device))
        if why:
            raise ValueError(f"{arch} on {device} is not supported yet: {why}, so the trainer would not score "
                             "what vLLM sampled. Run it on the CPU, or see docs/models.md for the families that "
                             "train exactly")
