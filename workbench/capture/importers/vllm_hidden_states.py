"""Import the files of vLLM's hidden-states connector (``ExampleHiddenStatesConnector``).

vLLM has no per-layer tensor dump; its hidden-states connector (the ``extract_hidden_states``
speculative method with ``kv_transfer_config`` naming ``ExampleHiddenStatesConnector``) writes one
``<request_id>.safetensors`` per finished request, holding ``hidden_states`` ``[T, layers, H]``
(the configured layers, in order) and ``token_ids`` ``[T]`` (the prompt, or every token but the
last with ``include_output_tokens``). A companion ``.lock`` file is ignored.

Mapping: request ids are random, so requests are identified by their tokens
(``prompt_id(token_ids)``, or of the first ``id_tokens`` of them): the requests, sorted by that id,
are steps 0, 1, ...; each step records its batch rows (request, positions 0..T-1), so two runs
pair request with request and token with token whatever their ids and order. Layer ``i`` of the
file is ``layers[i]`` (the aux-layer ids you configured; default 0, 1, ...), op ``hidden_states``,
name ``output``; ``token_ids`` is layer -1, op ``tokens``. Tags: ``request_id`` (the file's),
``file``.
"""

from __future__ import annotations

import os
from pathlib import Path

import torch

from workbench.capture.importers._files import Skips, check_src, check_tensor, natural_key, walk
from workbench.capture.importers.base import Importer
from workbench.capture.writer import CaptureWriter
from workbench.errors import ImporterError

__all__ = ["VLLMHiddenStatesImporter"]


def _layer_ids(layers, n: int, path: Path) -> list[int]:
    if layers in (None, "", ()):
        return list(range(n))
    ids = [int(x) for x in str(layers).replace(" ", "").split(",") if x] if isinstance(layers, str) else \
        [int(x) for x in layers]
    if len(ids) != n:
        raise ImporterError(f"layers names {len(ids)} layer ids but the file holds {n} layers", file=path,
                            key="layers", fix=f"pass the {n} layer ids the connector was configured with, e.g. "
                                              f"layers={','.join(map(str, range(n)))}")
    return ids


class VLLMHiddenStatesImporter(Importer):
    name = "vllm-hidden-states"
    description = "vLLM hidden-states connector: one <request_id>.safetensors per request, [T, layers, H]"

    def run(self, src: str | os.PathLike, dst: str | os.PathLike, *, arm: str | None = None,
            run: dict | None = None, on_error: str = "raise", layers: str = "", id_tokens: int = 0,
            overwrite: bool = False) -> Path:
        """Import ``src`` (the connector's storage folder) into a new capture at ``dst``.

        Parameters
        ----------
        layers: comma-separated layer ids of the file's layer axis (default 0, 1, ...)
        id_tokens: identify requests by their first this many tokens (0: all of ``token_ids``;
            use the prompt length when one run saved output tokens too)
        on_error: "raise" or "skip" (list unreadable files in ``run["importer"]["skipped"]``)
        """
        from safetensors import SafetensorError
        from safetensors.torch import load_file

        from workbench.capture.align import prompt_id

        root = check_src(src)
        skips = Skips(on_error, root)
        if not isinstance(id_tokens, int) or id_tokens < 0:
            raise ImporterError(f"id_tokens must be an int >= 0, got {id_tokens!r}", key="id_tokens",
                                fix="pass the prompt length, or 0 for every token")
        files = walk(root, (".safetensors",), skips)
        reqs = []
        for path, rel in files:
            try:
                try:
                    data = load_file(str(path))
                except (SafetensorError, OSError, ValueError) as e:
                    raise ImporterError(f"cannot read {path.name}: {e}", file=path, fix="re-run the request") from None
                if "hidden_states" not in data or "token_ids" not in data:
                    raise ImporterError(f"{path.name} holds {sorted(data)[:6]}, not hidden_states and token_ids",
                                        file=path, fix="point SRC at the connector's storage folder only")
                hs = check_tensor(data["hidden_states"], path, "hidden_states")
                ids = check_tensor(data["token_ids"], path, "token_ids").reshape(-1)
                if hs.dim() == 2:
                    hs = hs[:, None]
                if hs.dim() != 3 or hs.shape[0] != ids.shape[0]:
                    raise ImporterError(f"hidden_states {tuple(data['hidden_states'].shape)} does not fit "
                                        f"{ids.shape[0]} token ids ([T, layers, hidden] expected)", file=path,
                                        fix="re-run the request; the file may be cut")
                toks = ids.tolist()[:id_tokens] if id_tokens else ids.tolist()
                reqs.append(dict(path=path, rel=rel, hs=hs, ids=ids, rid=prompt_id(toks)))
            except ImporterError as err:
                skips(err)
        if not reqs:
            raise ImporterError("no hidden-states files (<request_id>.safetensors) found" +
                                (f"; {len(skips.items)} skipped" if skips.items else ""), file=root,
                                fix="point SRC at the connector's storage path (kv_connector_extra_config"
                                    "['shared_storage_path'])")
        reqs.sort(key=lambda r: (r["rid"], natural_key(r["rel"])))
        seen: dict[str, str] = {}
        for r in reqs:
            if r["rid"] in seen:
                raise ImporterError(f"{r['rel']} and {seen[r['rid']]} hold the same tokens: one request id cannot "
                                    "tell them apart", file=r["path"], key="id_tokens",
                                    fix="import them into separate captures, or set id_tokens")
            seen[r["rid"]] = r["rel"]
        meta = dict(run or {})
        info = {"kind": self.name, "source": str(root.resolve()), "files": len(files),
                "options": {"on_error": on_error, "layers": layers, "id_tokens": id_tokens}}
        with CaptureWriter(dst, arm=arm or root.resolve().name, run=meta, overwrite=overwrite) as w:
            for step, r in enumerate(reqs):
                lids = _layer_ids(layers, r["hs"].shape[1], r["path"])
                T = r["ids"].shape[0]
                tags = {"request_id": Path(r["rel"]).stem, "file": r["rel"]}
                w.add_batch(step, requests=[r["rid"]] * T, positions=range(T))
                w.add(r["ids"].to(torch.int64), step=step, layer=-1, op="tokens", name="token_ids", **tags)
                for i, lid in enumerate(lids):
                    w.add(r["hs"][:, i].contiguous(), step=step, layer=lid, op="hidden_states", name="output",
                          dims="t h", **tags)
            info.update(requests=len(reqs), skipped=skips.summary())
            meta["importer"] = info
            meta["requests"] = w.run.get("requests", [])
            w.run = meta
        return Path(dst)
