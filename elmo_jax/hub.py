"""Models on the Hugging Face hub, `hf://OWNER/REPO[@REVISION]`: a repo holding one
`*options.json` and one `*weights.hdf5` (bilm-tf's files, as AllenNLP published them, under any
names), fetched by `huggingface_hub` into its own cache (`HF_HOME`; etags, resumable downloads,
locks, `HF_HUB_OFFLINE`, `HF_ENDPOINT`, `HF_TOKEN`) and then loaded as any folder of such files.
What comes is checked as the published models' downloads are (`published.unlike`): a web page
or a damaged file is named, never loaded."""

from __future__ import annotations

import re
from pathlib import Path
from typing import TypeGuard

from elmo_jax.errors import UserError
from elmo_jax.published import DownloadFailed, unlike
from elmo_jax.switches import switch

PREFIX = "hf://"
_REPO = re.compile(r"[\w.-]+/[\w.-]+")
PATTERNS = ["*options.json", "*weights.hdf5", "vocab.txt"]  # what a model folder holds


def is_hub(source: object) -> TypeGuard[str]:
    return isinstance(source, str) and source.startswith(PREFIX)


def fetch_hub(source: str) -> Path:
    """The local folder of the hub model `source` (hf://OWNER/REPO[@REVISION]), its files
    downloaded into huggingface_hub's cache where missing (only the cache with
    ELMO_JAX_OFFLINE or HF_HUB_OFFLINE on)."""
    repo, _, revision = source[len(PREFIX) :].partition("@")
    if not _REPO.fullmatch(repo):
        raise UserError(f"{source}: a hub model is hf://OWNER/REPO or hf://OWNER/REPO@REVISION")
    try:
        import huggingface_hub
        from huggingface_hub import errors
    except ImportError:
        raise UserError(f"{source}: hub models need huggingface_hub: pip install 'elmo_jax[hub]'") from None
    try:
        folder = Path(
            huggingface_hub.snapshot_download(
                repo,
                revision=revision or None,
                allow_patterns=PATTERNS,
                local_files_only=switch("ELMO_JAX_OFFLINE"),
                library_name="elmo_jax",
            )
        )
    except (errors.HfHubHTTPError, errors.LocalEntryNotFoundError, OSError, ValueError) as e:
        reason = " ".join(str(e).split())[:300]
        raise DownloadFailed(f"cannot fetch {source} from {huggingface_hub.constants.ENDPOINT} ({reason})") from None
    for path in sorted(folder.iterdir()):
        problem = unlike(path) if path.suffix in (".json", ".hdf5") else None
        if problem:
            raise DownloadFailed(f"{source}: its {path.name} is {problem}")
    return folder
