"""One KB root with its state folder and settings: what every command starts from."""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path

from orchestrator.config import Settings, load_settings
from orchestrator.kb.gates import Catalog, CatalogCache
from orchestrator.kb.notes import KB
from orchestrator.state.store import Store, StoreError, lost_record


@dataclass
class Workspace:
    settings: Settings
    _store: Store | None = field(default=None, repr=False)
    _catalogs: CatalogCache = field(default_factory=CatalogCache, repr=False)

    @classmethod
    def open(
        cls,
        root: str | Path = ".",
        state: str | Path | None = None,
        config: str | Path | None = None,
    ) -> Workspace:
        return cls(load_settings(root, state, config))

    @property
    def root(self) -> Path:
        return self.settings.root

    @property
    def state_dir(self) -> Path:
        return self.settings.state_dir

    @cached_property
    def kb(self) -> KB:
        return KB.open(
            self.root,
            self.settings.note_roots,
            self.settings.max_note_bytes,
            self.settings.exclude,
        )

    def catalog(self) -> Catalog:
        """The gates and type specs as the files are now: parsed again only when one of
        them changed (:class:`CatalogCache`), so a gate edited between two transactions is
        seen. Within one write transaction (a batch of outcomes decided together, at one
        moment as far as any reader can tell) the files are looked at once: the look, a
        walk of two folders and a stat per file, cost more than the rest of a job's audit
        check."""
        within = self._store.writing if self._store is not None else None
        return self._catalogs.load(self.kb, within=within)

    @property
    def store(self) -> Store:
        if self._store is None:
            self._store = Store.open(self.state_dir)
        return self._store

    def require_state(self) -> None:
        """Refuse a state folder where nothing has run: read as empty, a mistyped
        ``--state`` made ``status`` say all was clear."""
        path = self.state_dir / "state.db"
        if not path.exists():
            # Where job folders say something has run, what is missing is its record.
            raise StoreError(
                lost_record(path, "missing")
                or workers_own(self.state_dir)
                or f"{self.state_dir}: no state.db here; nothing has run with this state "
                "folder yet (is --state or --root right?)"
            )

    def read_store(self, *, empty_if_new: bool = False) -> Store:
        """The store for a read-only command; a missing state.db is not created. It is
        refused (:meth:`require_state`) unless ``empty_if_new``: a first ``select`` is
        right to read no history."""
        if self._store is None:
            if not (self.state_dir / "state.db").exists():
                if empty_if_new and not lost_record(self.state_dir / "state.db", "missing"):
                    return Store.open(self.state_dir, readonly=True)
                self.require_state()
            self._store = Store.open(self.state_dir, reading=True)
        return self._store

    def close(self) -> None:
        if self._store is not None:
            self._store.close()
            self._store = None


def workers_own(state_dir: Path) -> str | None:
    """Why a command about the record finds none in ``state_dir``, when it is a worker's
    own folder (its attempt folders, made by no control; state.db is the control's alone):
    "nothing has run with this state folder yet" was said of the folder a worker ran in
    all night, on a second machine. None for any other folder."""
    if (state_dir / "state.db").exists() or not (state_dir / "attempts").is_dir():
        return None
    return (
        f"{state_dir} is a worker's own folder (a worker ran here; state.db is the "
        "control's alone): status, report, job and the other commands about the record run "
        "on the machine where `reviewq control` runs (here, `reviewq doctor --worker` names "
        "its host and state folder, and `reviewq logs` reads this worker's log)"
    )
