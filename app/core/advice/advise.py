"""Which file of a family runs on this device: for each stored form the family is published in
(`app/resources/family_forms.json`), what the device does with it (`device_use`), the memory it
needs on this card and in RAM (`sizes`), and whether a saved check proved it on this device
(`health.saved`), in one sentence each; led by the answer, which file to take (`answer`), and a
table of the forms. The command line and the window show the same record.
No torch here: the window asks this too.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from app import __version__
from app.core.advice.answer import Row, answer_words, rows
from app.core.advice.device_use import DeviceUse, device_use
from app.core.advice.kernels import untried_words
from app.core.advice.sizes import (
    GIB,
    NO_ROOM,
    STREAMS,
    SizeFit,
    family_table,
    projections_for,
    size_fit,
)
from app.core.errors import HalfSafeError
from app.core.formats.forms import BY_KEY
from app.core.hardware.records import DeviceInfo, HardwareReport, device_entry
from app.core.health.saved import SavedReport


@dataclass(frozen=True)
class Proof:
    """The newest saved check of the family in one form on this device: its verdict and the
    model it checked; `verdict` None when none is saved."""

    verdict: str | None = None
    model: str = ""
    saved_at: float | None = None

    def to_json(self) -> dict[str, Any]:
        return {"verdict": self.verdict, "model": self.model or None, "saved_at": self.saved_at}


@dataclass(frozen=True)
class FormAdvice:
    """One stored form: what the device does with it, what it needs, what a check proved, and
    the sentence that says all three."""

    form: str
    words: str
    use: DeviceUse
    sizes: tuple[SizeFit, ...]
    proof: Proof
    sentence: str

    def to_json(self) -> dict[str, Any]:
        return {
            "form": self.form,
            "words": self.words,
            "device_use": self.use.use,
            "precision": self.use.precision,
            "memory": [fit.to_json() for fit in self.sizes],
            "proved": self.proof.to_json(),
            "sentence": self.sentence,
        }


@dataclass(frozen=True)
class FamilyAdvice:
    """Every published form of one family on one device (`halfsafe advise FAMILY`)."""

    family: str
    architecture: str
    title: str
    device: DeviceInfo
    ram_bytes: int | None
    forms: list[FormAdvice] = field(default_factory=list)
    # The answer (`answer.answer_words`), the table's rows, and where the family publishes int8
    # ConvRot on a GPU whose int8 kernels the self-test has not tried, the sentence saying so.
    answer: str = ""
    table: list[Row] = field(default_factory=list)
    kernels: str = ""

    def device_words(self) -> str:
        """ "NVIDIA GeForce GTX 1660 (cuda, compute capability 7.5, 6.0 GB; 16 GB of RAM)"."""
        facts = [self.device.kind]
        if self.device.capability is not None:
            facts.append("compute capability {}.{}".format(*self.device.capability))
        if self.device.kind not in ("cpu", "mps") and self.device.memory_total_mb:
            facts.append(f"{self.device.memory_total_mb / 1024:.1f} GB")
        ram = f"; {self.ram_bytes / GIB:.0f} GB of RAM" if self.ram_bytes else ""
        return f"{self.device.name} ({', '.join(facts)}{ram})"

    def to_json(self) -> dict[str, Any]:
        """The object `halfsafe advise FAMILY --json` prints (docs/json.md)."""
        return {
            "halfsafe": __version__,
            "family": self.family,
            "architecture": self.architecture,
            "title": self.title,
            "device": {
                "kind": self.device.kind,
                "name": self.device.name,
                "capability": list(self.device.capability) if self.device.capability else None,
                "memory_total_mb": self.device.memory_total_mb,
            },
            "ram_bytes": self.ram_bytes,
            "forms": [form.to_json() for form in self.forms],
            "answer": self.answer,
            "table": [row.to_json() for row in self.table],
            "int8_kernels": self.kernels or None,
        }


def family_names() -> list[str]:
    """Every name `advise` takes: each family's id and its architecture names, registry order."""
    from app.core.families.registry import FAMILIES

    names: list[str] = []
    for family in reversed(FAMILIES):
        for name in (family.id, *family.architectures):
            if name not in names:
                names.append(name)
    return names


def architecture_choices() -> list[tuple[str, str]]:
    """(architecture name, its title) for every architecture of every family, registry order:
    the choices of the window's family chooser."""
    from app.core.families.registry import FAMILIES

    return [(name, title) for f in reversed(FAMILIES) for name, title in f.architectures.items()]


def resolve_family(name: str) -> tuple[str, str, str]:
    """(family id, architecture, title) for a family id ("flux2klein"), an architecture name
    ("flux-dev", "sd1-inpaint") or a title the window shows ("Flux.1 dev", "Flux.2 Klein"), in
    any case; HalfSafeError listing the names for any other."""
    from app.core.families.registry import FAMILIES, architecture_title, family_of_architecture

    wanted = " ".join(name.split()).lower()
    for family in FAMILIES:
        if wanted == family.id:
            return family.id, next(iter(family.architectures)), family.title
    for architecture, title in architecture_choices():
        if wanted == title.lower():
            return resolve_family(architecture)
    for family in FAMILIES:
        if wanted == family.title.lower():
            return family.id, next(iter(family.architectures)), family.title
    family = family_of_architecture(wanted) if wanted else None
    # A variant the titles know ("sd2-inpaint") is its family's; any other word after a
    # family's name ("flux-foo") is no architecture.
    if family is None or (
        wanted not in family.architectures and architecture_title(wanted) == wanted
    ):
        raise HalfSafeError(
            f"'{name}' is not a model family HalfSafe runs; give one of: "
            f"{', '.join(family_names())}."
        )
    return family.id, wanted, architecture_title(wanted)


def advise(
    name: str, device: DeviceInfo, ram_bytes: int | None, saved: Sequence[SavedReport] = ()
) -> FamilyAdvice:
    """The advice for family `name` on `device` with `ram_bytes` of RAM (None: unknown), from
    the saved check reports `saved` (any device's: those of this device count). Pure."""
    family_id, architecture, title = resolve_family(name)
    from app.core.families.registry import family

    architectures = set(family(family_id).architectures)
    projections = projections_for(family_id, architecture)
    gpu = device.kind not in ("cpu", "mps")
    card = device.memory_total_mb * 2**20 if gpu and device.memory_total_mb else None
    forms = []
    for key in family_table()["forms"].get(family_id, ["bf16"]):
        form = BY_KEY[key]
        use = device_use(key, device)
        fits = tuple(size_fit(p, form.bytes_per_weight, card, ram_bytes) for p in projections)
        proof = _proof(saved, device.name, architectures, key)
        sentence = (
            f"{form.words}: {use.words}; {_memory_words(title, fits, gpu)}; "
            f"{_proof_words(proof, title)}."
        )
        forms.append(FormAdvice(key, form.words, use, fits, proof, sentence))
    advice = FamilyAdvice(family_id, architecture, title, device, ram_bytes, forms)
    table = rows(forms, gpu)
    kernels = untried_words(device) if any(f.form == "int8-convrot" for f in forms) else ""
    return replace(advice, answer=answer_words(advice, table), table=table, kernels=kernels)


def advise_on(
    name: str, report: HardwareReport, device: str = "auto", saved: Sequence[SavedReport] = ()
) -> FamilyAdvice:
    """`advise` on the report's device that the device setting picks, with the computer's RAM
    as the report's CPU entry gives it."""
    chosen = device_entry(report.devices, device)
    if chosen is None:
        raise HalfSafeError("The hardware report lists no device to advise for.")
    cpu = next((d for d in report.devices if d.kind == "cpu"), None)
    ram = cpu.memory_total_mb * 2**20 if cpu is not None and cpu.memory_total_mb else None
    return advise(name, chosen, ram, saved)


def _proof(saved: Sequence[SavedReport], device: str, architectures: set[str], form: str) -> Proof:
    mine = [
        r
        for r in saved
        if r.device == device
        and r.stored_form == form
        and (r.architecture in architectures or r.architecture.split("-")[0] in architectures)
    ]
    if not mine:
        return Proof()
    newest = max(mine, key=lambda r: r.saved_at)
    return Proof(newest.verdict.value, newest.model_name, newest.saved_at)


def _proof_words(proof: Proof, title: str) -> str:
    if proof.verdict is None:
        return f"no check of a {title} model in this form on this device is saved"
    model = proof.model or f"a {title} model"
    return {
        "healthy": f"the check proved {model} in this form healthy on this device",
        "fixable": f"the check proved a fix for {model} in this form on this device",
    }.get(proof.verdict, f"the check found {model} in this form broken on this device")


def _memory_words(title: str, fits: Sequence[SizeFit], gpu: bool) -> str:
    if not fits:
        return f"HalfSafe has no projection of {title}'s size at real size yet"
    return "; ".join(_fit_words(fit, gpu) for fit in fits)


def _fit_words(fit: SizeFit, gpu: bool) -> str:
    files = f"{fit.model}'s files hold {fit.files_bytes / GIB:.1f} GiB"
    if fit.ram_bytes is None:
        ram = "this computer's RAM is unknown"
    else:
        fits = "they fit in" if fit.ram_fits else "they need more than"
        ram = f"{fits} this computer's {fit.ram_bytes / GIB:.0f} GB of RAM"
    if not gpu:
        return f"{files}, and this device computes in the computer's memory: {ram}"
    if fit.card is None or fit.card_bytes is None:
        return f"{files}: this card's memory is unknown, and {ram}"
    card = f"this {fit.card_bytes / GIB:.0f} GB card"
    if fit.card == NO_ROOM:
        short = ", ".join(f"the {part} needs {need / GIB:.1f} GiB" for part, need in fit.short)
        on_card = f"it does not run on {card} ({short})"
    elif fit.card == STREAMS:
        on_card = f"it streams its {' and '.join(fit.streamed)} block by block on {card}"
    else:
        on_card = f"it runs whole on {card}"
    return f"{files}: {on_card}, and {ram}"
