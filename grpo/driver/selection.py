"""eval.select: the adapter the test set scores. "last": the last step's. "best": of the starting adapter, each
periodic eval's and the last step's, the one with the highest validation success (a tie keeps the earlier: as good
with fewer updates). The best so far lives in the checkpointed RunState.best ({"step", "version",
"success_rate"}); its store version is leased (reader best-vNNNNNN) so that garbage collection keeps its files."""
from __future__ import annotations

import sys

from sync import AdapterNotFoundError, AdapterStore


def note(rule: str, state, store_root: str, step: int, evaluation: dict) -> None:
    """The adapter served now (state.version) after `step` steps, validated at `evaluation`: the best when it
    beats every earlier one."""
    best = state.best
    if rule != "best" or (best is not None and evaluation["success_rate"] <= best["success_rate"]):
        return
    AdapterStore(store_root).mark_in_use(_reader(state.version), state.version)
    state.best = {"step": step, "version": state.version, "success_rate": evaluation["success_rate"]}


def restarted(rule: str, state, store_root: str) -> None:
    """After (re)starting: the starting adapter is the first candidate; a best restored from a checkpoint has its
    lease renewed, or, collected meanwhile, is dropped with a line."""
    if rule != "best":
        return
    if state.best is None and state.step == 0:
        note(rule, state, store_root, 0, state.eval_before)
    elif state.best is not None:
        version = state.best["version"]
        try:
            AdapterStore(store_root).mark_in_use(_reader(version), version)
        except AdapterNotFoundError:
            print(f"[grpo] eval.select best: the best adapter of the checkpoint resumed (v{version}, step "
                  f"{state.best['step']}) is no longer in the store; the best is picked from step {state.step + 1} "
                  "on", file=sys.stderr)
            state.best = None


def saved(state, store_root: str) -> None:
    """After a checkpoint: it names state.best, so earlier bests' versions may go (a resume that falls back to an
    older kept checkpoint may then find its best collected: `restarted` says so). Renews the best's lease."""
    if state.best is None:
        return
    store, keep = AdapterStore(store_root), _reader(state.best["version"])
    store.mark_in_use(keep, state.best["version"])
    for reader in store.readers():
        if reader.startswith(_READER) and reader != keep:
            store.release(reader)


def final(rule: str, state, evaluate, serve) -> tuple[dict, dict]:
    """The evaluation after training (`evaluate(label=...)` on the validation seeds) and summary.json's
    `selected`: the last step's adapter, or the best one when it validated above it, served (`serve(version)`)
    and validated again."""
    after = evaluate(label="after")
    last = {"rule": rule, "step": state.step, "adapter_version": state.version, "validation": after["success_rate"]}
    best = state.best
    if rule != "best" or best is None or best["success_rate"] <= after["success_rate"]:
        return after, last
    serve(best["version"])
    chosen = evaluate(label="selected")
    print(f"[grpo] eval.select best: step {best['step']}'s adapter (v{best['version']}, validation "
          f"{chosen['success_rate']:.1%}) over the last step's ({after['success_rate']:.1%})", file=sys.stderr)
    return chosen, {**last, "step": best["step"], "adapter_version": best["version"],
                    "validation": chosen["success_rate"], "validation_at_step": best["success_rate"],
                    "last_step": state.step, "last_step_validation": after["success_rate"]}


_READER = "best-v"  # + the version: one lease a best, so that a new best's lease never drops the one before


def _reader(version: int) -> str:
    return f"{_READER}{version:06d}"
