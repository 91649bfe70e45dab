"""Checkpoint exchange through shared storage: any fsspec URL (a directory, file://, s3://, ...).

Layout: ROOT/model{M}/step{S:010d}.safetensors. A checkpoint is written under a temporary name
and renamed into place, so a reader never sees a partial file (on object stores the upload
itself is atomic). Its safetensors metadata holds the step, the model id, an architecture
signature (names, shapes and dtypes) and the SHA-256 of the tensor bytes, which the reader
checks: a truncated or corrupt checkpoint, or one of another architecture than the reader's model, is
skipped with one warning per file and an older one is used; a step past `last_step` (when the reader
sets it: the last step any writer of the run could reach) is ignored, with one warning per file.
Bytes written and read are counted under the tag "ckpt" (they cross a process boundary through
the storage); a write also counts as inter-site bytes when the ranks span more than one site, since
readers in another site than the writer fetch it across the slow link (lowband.net.sites); a
modelled link then holds the writer for the write's transfer time on the inter-site link.
Safetensors holds tensors only: nothing in a checkpoint can run code.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import re
import struct
import uuid

import fsspec
import torch
from safetensors.torch import load as load_bytes
from safetensors.torch import save as save_bytes

from lowband.comm.ledger import Traffic
from lowband.comm.value_codecs import dequantize_chunks, quantize_chunks
from lowband.errors import ConfigError

STORED = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16, "int8": torch.int8}
SCALE = ".__scale__"  # int8: the float32 scales of tensor T are the tensor T.__scale__
KEEP = 3  # versions kept per model: a reader may still be fetching the one before the newest
NAME = re.compile(r"step(\d{10})\.safetensors$")


def _stored(tensor: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    return tensor.to(dtype) if tensor.dtype == torch.float32 else tensor


def encode_state(state: dict[str, torch.Tensor], dtype: torch.dtype) -> dict[str, torch.Tensor]:
    """The tensors a checkpoint file holds. int8: each float32 tensor T becomes int8 levels of T's
    shape and T.__scale__, one float32 scale (max |x| / 127) per 1,024 values in C order
    (comm/value_codecs.py's quantize_chunks)."""
    if dtype != torch.int8:
        return {k: _stored(v.detach().cpu(), dtype).contiguous() for k, v in state.items()}
    out: dict[str, torch.Tensor] = {}
    for key, value in state.items():
        v = value.detach().cpu()
        if v.dtype != torch.float32:
            out[key] = v.contiguous()
            continue
        levels, scale = quantize_chunks(v, 127)
        out[key], out[key + SCALE] = levels.to(torch.int8).reshape(v.shape).contiguous(), scale.contiguous()
    return out


def decode_state(stored: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """A checkpoint file's tensors as the model's: half precision and int8 read back as float32."""
    out: dict[str, torch.Tensor] = {}
    for key, value in stored.items():
        if key.endswith(SCALE):
            continue
        scale = stored.get(key + SCALE)
        if scale is not None:
            out[key] = dequantize_chunks(value, scale).reshape(value.shape)
        elif value.dtype in (torch.float16, torch.bfloat16):
            out[key] = value.float()
        else:
            out[key] = value
    return out


def signature(state: dict[str, torch.Tensor]) -> str:
    """Architecture fingerprint: every tensor's name, shape and dtype."""
    text = ";".join(f"{k}:{tuple(v.shape)}:{v.dtype}" for k, v in sorted(state.items()))
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def digest(state: dict[str, torch.Tensor]) -> str:
    h = hashlib.sha256()
    for key in sorted(state):
        h.update(key.encode())
        h.update(state[key].detach().cpu().contiguous().view(torch.uint8).numpy().tobytes())
    return h.hexdigest()


def read_metadata(data: bytes) -> dict:
    (size,) = struct.unpack("<Q", data[:8])
    return json.loads(data[8:8 + size]).get("__metadata__", {})


class CheckpointStore:
    def __init__(self, url: str, comm=None, log: logging.Logger | None = None, tag: str = "ckpt",
                 dtype: str = "fp32"):
        """`dtype` fp16 or bf16: floating tensors are stored at half precision (half the bytes); int8: as
        8-bit levels with a float32 scale per 1,024 values (a quarter of the bytes). Either way still a
        plain safetensors file, read back as float32."""
        self.url, self.comm, self.tag, self.dtype = url, comm, tag, STORED[dtype]
        self.last_step: int | None = None  # steps past it are no writer's (see the module doc)
        self.log = log or logging.getLogger("lowband")
        try:
            self.fs, self.root = fsspec.core.url_to_fs(url)
            self.fs.makedirs(self.root, exist_ok=True)
            probe = f"{self.root}/.probe-{uuid.uuid4().hex}"
            self.fs.pipe_file(probe, b"ok")
            self.fs.rm_file(probe)
        except Exception as e:  # unreachable, read-only, unknown protocol, missing driver
            raise ConfigError("method.store", url,
                              f"must be a writable directory or fsspec URL ({type(e).__name__}: {e})") from None

    def _dir(self, model: int) -> str:
        return f"{self.root}/model{model}"

    def publish(self, model: int, step: int, state: dict[str, torch.Tensor]) -> None:
        tensors = encode_state(state, self.dtype)
        meta = {"step": str(step), "model": str(model), "signature": signature(tensors), "sha256": digest(tensors)}
        data = save_bytes(tensors, metadata=meta)
        folder = self._dir(model)
        self.fs.makedirs(folder, exist_ok=True)
        final, tmp = f"{folder}/step{step:010d}.safetensors", f"{folder}/.tmp-{uuid.uuid4().hex}"
        self.fs.pipe_file(tmp, data)
        self.fs.mv(tmp, final)
        if self.comm is not None:
            self.comm.stored(self.tag, len(data))
        self._prune(model, step)

    def _prune(self, model: int, published: int) -> None:
        """Keep the KEEP newest checkpoints up to the one just published; a file claiming a later step
        is not this writer's (garbage, or a stale writer's) and neither counts nor is removed here."""
        mine = [v for v in self.versions(model) if v <= published]
        for old in mine[:-KEEP]:
            self._remove(f"{self._dir(model)}/step{old:010d}.safetensors")

    def versions(self, model: int) -> list[int]:
        try:
            names = self.fs.ls(self._dir(model), detail=False)
        except FileNotFoundError:
            return []
        steps, last = sorted(int(m.group(1)) for m in (NAME.search(n) for n in names) if m), self.last_step
        if last is None:
            return steps
        for step in (s for s in steps if s > last):
            self._warn(f"{self._dir(model)}/step{step:010d}.safetensors",
                       f"step {step} is past the run's last step {last}: no writer of the run made it", "impossible")
        return [step for step in steps if step <= last]

    def load_newest(self, model: int, newer_than: int = -1, at_most: int | None = None,
                    like: dict[str, torch.Tensor] | None = None) -> tuple[int, dict[str, torch.Tensor]] | None:
        """The newest intact checkpoint of `model` with newer_than < step <= at_most (and, given `like`,
        of its architecture), or None."""
        for step in reversed(self.versions(model)):
            if at_most is not None and step > at_most:
                continue
            if step <= newer_than:
                return None
            state = self._read(model, step)
            problem = architecture_problem(like, state) if like is not None and state is not None else None
            if problem:
                self._warn(f"{self._dir(model)}/step{step:010d}.safetensors", problem, "another architecture's")
            elif state is not None:
                return step, state
        return None

    def _read(self, model: int, step: int) -> dict[str, torch.Tensor] | None:
        path = f"{self._dir(model)}/step{step:010d}.safetensors"
        try:
            data = self.fs.cat_file(path)
        except FileNotFoundError:
            return None  # pruned while we looked
        except OSError as e:  # a directory or an unreadable file under a checkpoint's name
            self._warn(path, f"not a readable file ({type(e).__name__})")
            return None
        if self.comm is not None:
            self.comm.ledger.outside(self.tag, Traffic(recv=len(data)))
        try:
            meta, state = read_metadata(data), load_bytes(data)
            if digest(state) != meta.get("sha256"):
                raise ValueError("checksum mismatch")
            if not all(torch.isfinite(v).all() for v in state.values() if v.is_floating_point()):
                raise ValueError("non-finite weights")
        except Exception as e:
            self._warn(path, f"{type(e).__name__}: {e}")
            return None
        return decode_state(state)

    def _warn(self, path: str, why: str, kind: str = "damaged") -> None:
        """One warning per skipped path (`kind`: why it cannot be used), however often it is looked at."""
        warned = self.__dict__.setdefault("_warned", set())
        if path not in warned:
            warned.add(path)
            self.log.warning(f"skipping {kind} checkpoint {path} ({why}); keeping the previous one")

    def _remove(self, path: str) -> None:
        with contextlib.suppress(FileNotFoundError):
            self.fs.rm_file(path)


def architecture_problem(expected: dict[str, torch.Tensor], got: dict[str, torch.Tensor]) -> str | None:
    """How `got` differs from `expected` in tensor names, shapes or dtypes (None: it does not)."""
    if signature(expected) == signature(got):
        return None
    missing, extra = sorted(set(expected) - set(got)), sorted(set(got) - set(expected))
    shapes = [f"{k} {tuple(got[k].shape)} (not {tuple(expected[k].shape)})" for k in sorted(set(expected) & set(got))
              if got[k].shape != expected[k].shape or got[k].dtype != expected[k].dtype]
    parts = ([f"missing {', '.join(missing[:3])}" + (f" and {len(missing) - 3} more" if len(missing) > 3 else "")]
             if missing else []) + ([f"unexpected {', '.join(extra[:3])}" + (f" and {len(extra) - 3} more"
                                                                             if len(extra) > 3 else "")] if extra else [])
    parts += [f"{', '.join(shapes[:3])}" + (f" and {len(shapes) - 3} more" if len(shapes) > 3 else "")] if shapes else []
    return "; ".join(parts) or "tensor dtypes differ"
