"""The picker's option controls: the builder keyword each drives, gossip's modes (synchronous and
asynchronous in one dropdown), a PS plan's consistency, and a picked plan's options back onto the
controls."""

from __future__ import annotations

from typing import Any

from distlab.strategy.types import ASYNC_GOSSIP_MODES

# The options a control drives, and the builder keyword it maps to.
OPTION_CONTROLS = ("chunk_size", "servers", "topology", "dynamic", "mode", "compressor")
# gossip's modes as the dropdown offers them: ATC and AWC synchronous, push-sum and neighbour
# averaging asynchronous (BlueFog's windows; ``asynchronous=True``, priced at each rank's own pace)
GOSSIP_MODE_CHOICES = [
    ("atc", "atc"),
    ("awc", "awc"),
    ("push_sum (async)", "push_sum"),
    ("average (async)", "average"),
]

# a PS plan's consistency (AutoDist's sync and staleness): the staleness, or "async" (``sync=False``)
CONSISTENCY_CHOICES = [("synchronous", 0), ("stale, s=1", 1), ("stale, s=2", 2), ("stale, s=4", 4)]
CONSISTENCY_CHOICES += [("asynchronous", "async")]


def consistency_control(style: dict[str, str]) -> Any:
    """The dropdown of a PS plan's consistency (priced at it: costmodel/consistency.py)."""
    import ipywidgets as w

    return w.Dropdown(options=CONSISTENCY_CHOICES, value=0, description="consistency", style=style)


def builder_params(name: str) -> set[str]:
    """Keyword options the builder accepts (read from its signature)."""
    from distlab.strategy import builder_options

    return set(builder_options(name))


def options_from(picker: Any) -> dict[str, Any]:
    """The options ``picker``'s builder accepts, from its controls (an asynchronous gossip mode
    asks for ``asynchronous=True``); the controls it does not take are disabled."""
    accepted = builder_params(picker.builder.value)
    opts: dict[str, Any] = {key: getattr(picker, key).value for key in OPTION_CONTROLS if key in accepted}
    if "asynchronous" in accepted and "mode" in opts:
        opts["asynchronous"] = opts["mode"] in ASYNC_GOSSIP_MODES
    if "batch_size" in accepted:
        opts["batch_size"] = picker.batch.value
    for c in OPTION_CONTROLS:
        getattr(picker, c).disabled = c not in accepted
    consistency = getattr(picker, "consistency", None)
    if consistency is not None:
        consistency.disabled = "staleness" not in accepted
        if not consistency.disabled and consistency.value == "async":
            opts["sync"] = False
        elif not consistency.disabled and consistency.value:
            opts["staleness"] = consistency.value
    return opts


def show_options(picker: Any, plan: Any) -> None:
    """``plan``'s options on ``picker``'s controls (a gossip plan's mode as it runs, its default
    included, so that an asynchronous plan stays asynchronous)."""
    opts = dict(getattr(plan, "options", {}) or {})
    gossip = getattr(plan, "gossip", None)
    if gossip is not None and getattr(plan, "builder", None) == "Gossip":
        opts["mode"] = gossip.mode
    for key in OPTION_CONTROLS:
        if key in opts and opts[key] in values_of(getattr(picker, key)):
            getattr(picker, key).value = opts[key]
    if "batch_size" in opts:
        picker.batch.value = opts["batch_size"]
    if getattr(picker, "consistency", None) is not None and hasattr(plan, "consistency"):
        sync, staleness = plan.consistency  # a picked stale or asynchronous plan stays so
        value = staleness if sync else "async"
        if value not in values_of(picker.consistency):
            picker.consistency.options = [*picker.consistency.options, (f"stale, s={value}", value)]
        picker.consistency.value = value


def values_of(widget: Any) -> list[Any]:
    """The values a control can take (a checkbox's: True and False)."""
    opts = getattr(widget, "options", None)
    if opts is None:
        return [True, False]
    return [o[1] if isinstance(o, tuple) else o for o in opts]
