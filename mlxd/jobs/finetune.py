"""The fine-tuning driver: a LoRA / DoRA adapter trained with mlx-lm's own trainer.

mlx-lm's `train()` is called as it is, with three arguments of ours: a batch generator wrapping
the stock one (it counts steps, reports progress and checkpoints every step, and returns on a
stop request, so the trainer's loop ends normally and its final save keeps the work done), a loss
that cannot be NaN on a batch without targets, and a callback that turns loss reports into metrics
events. `mlx_lm.lora.run` is not used: it drops its caller's callback.
"""

import math
import time
from pathlib import Path
from typing import Any

import mlx.core as mx
import mlx.optimizers as optim
import numpy as np
from mlx_lm.tuner.callbacks import TrainingCallback
from mlx_lm.tuner.trainer import TrainingArgs, train
from mlx_lm.tuner.trainer import iterate_batches as stock_batches
from mlx_lm.tuner.utils import linear_to_lora_layers
from mlx_lm.utils import load, save_config

from .finetune_data import load_examples, read_jsonl
from .finetune_guards import check_finite_adapter, guarded_loss, target_count
from .finetune_spec import BASE_LEARNING_RATE, FineTuneSpec
from .report import JobError, Reporter

__all__ = ["FineTuneSpec", "run_finetune"]
ADAPTER_DIR, ADAPTER_FILE = "adapter", "adapters.safetensors"


def _num(v: Any) -> float | None:
    """A float for the event stream; None for NaN / inf (they are not JSON)."""
    v = float(v)
    return v if math.isfinite(v) else None


class _Tracker(TrainingCallback):
    """The job's view of one `train()` call: steps, tokens, metrics, checkpoints, stop."""

    def __init__(self, report: Reporter, total: int, folder: Path) -> None:
        self.report, self.total, self.folder = report, total, folder
        self.steps = 0  # batches handed to the trainer; each one is a step that ran
        self.done = 0  # steps whose progress and checkpoints were reported
        self.tokens = 0
        self.stopped = self.diverged = False
        self.latest: dict[str, float | None] = {}
        self.seen: set[Path] = set()
        self.start = 0.0

    def batches(self, dataset: Any, batch_size: int, max_seq_length: int, loop: bool = False,
                seed: int | None = None, comm_group: Any = None) -> Any:  # fmt: skip
        """The trainer's `iterate_batches`: the stock batches, one step at a time."""
        stock = stock_batches(dataset=dataset, batch_size=batch_size, max_seq_length=max_seq_length,
                              loop=loop, seed=seed, comm_group=comm_group)  # fmt: skip
        if not loop:  # evaluate() iterates the validation set once
            yield from stock
            return
        self.start = time.perf_counter()
        for batch in stock:
            if self.report.stop_requested() or self.diverged:
                self.stopped = not self.diverged
                return  # the trainer's zip ends; its final save writes the adapter as it is
            self.tokens += target_count(*batch)
            self.steps += 1
            yield batch
            self.after_step()  # step `self.steps` has run (and saved, if it was due)

    def after_step(self) -> None:
        if self.done == self.steps:
            return
        self.done = self.steps
        elapsed = time.perf_counter() - self.start
        eta = elapsed / self.done * (self.total - self.done) if self.done < self.total else 0.0
        self.report.progress(self.done / self.total, eta_s=round(eta, 1))
        for path in sorted(self.folder.glob(f"*_{ADAPTER_FILE}")):
            if path not in self.seen:
                self.seen.add(path)
                step = int(path.name.split("_", 1)[0])
                self.report.checkpoint(step, str(path), **self.latest)

    def on_train_loss_report(self, info: dict) -> None:
        loss = _num(info["train_loss"])
        self.diverged = self.diverged or loss is None
        self.latest["train_loss"] = loss
        self.report.metrics(
            int(info["iteration"]),
            train_loss=loss,
            learning_rate=_num(info["learning_rate"]),
            tokens_per_sec=_num(info["tokens_per_second"]),
            trained_tokens=int(info["trained_tokens"]),
            peak_memory=int(mx.get_peak_memory()),  # bytes (the trainer's info has GB)
        )

    def on_val_loss_report(self, info: dict) -> None:
        self.latest["valid_loss"] = _num(info["val_loss"])
        self.report.metrics(int(info["iteration"]), valid_loss=self.latest["valid_loss"])


def _load(spec: FineTuneSpec, report: Reporter) -> tuple[Any, Any]:
    report.progress(0.0, stage="loading")
    try:
        return load(spec.model)
    except Exception as e:
        msg = " ".join(str(e).split())[:300]
        raise JobError("invalid_model", f"{spec.model}: cannot be loaded: {msg}") from None


def _check_sizes(train_set: Any, valid_set: Any, batch_size: int) -> None:
    for field, ds in (("train_file", train_set), ("valid_file", valid_set)):
        if ds is not None and len(ds) < batch_size:
            raise JobError(
                "invalid_file",
                f"{field}: {len(ds)} examples, fewer than batch_size {batch_size}",
            )


def _num_layers(spec: FineTuneSpec, model: Any, report: Reporter) -> int:
    """The blocks to adapt; more than the model has means all of them (16 is only a default)."""
    n = len(model.layers)
    if spec.num_layers == -1 or spec.num_layers >= n:
        if spec.num_layers > n:
            report.message(f"num_layers {spec.num_layers} > the model's {n} blocks: using all")
        return n
    return spec.num_layers


def _hyperparameters(spec: FineTuneSpec, n: int) -> dict[str, Any]:
    return {
        "n_epochs": spec.resolved_epochs(n) if spec.iters is None else None,
        "batch_size": spec.resolved_batch_size(n),
        "learning_rate_multiplier": spec.resolved_learning_rate() / BASE_LEARNING_RATE,
        "learning_rate": spec.resolved_learning_rate(),
        "iters": spec.resolved_iters(n),
    }


def run_finetune(spec: FineTuneSpec, out: Path, report: Reporter) -> dict:
    """Train an adapter into `out/adapter` (mlx-lm's format: `adapter_config.json`,
    `adapters.safetensors`, checkpoints `{step:07d}_adapters.safetensors`)."""
    np.random.seed(spec.seed)  # the batch order (mlx-lm's batcher draws from numpy)
    read_jsonl(spec.train_file, "train_file")  # a bad file fails before the model loads
    if spec.valid_file is not None:
        read_jsonl(spec.valid_file, "valid_file")
    model, tokenizer = _load(spec, report)
    train_set = load_examples(spec.train_file, "train_file", tokenizer, spec.mask_prompt)
    valid_set = None
    if spec.valid_file is not None:
        valid_set = load_examples(spec.valid_file, "valid_file", tokenizer, spec.mask_prompt)
    hp = _hyperparameters(spec, len(train_set))
    _check_sizes(train_set, valid_set, hp["batch_size"])

    mx.random.seed(spec.seed)  # LoRA's initial lora_a, as mlx_lm.lora.train_model seeds it
    model.freeze()
    num_layers = _num_layers(spec, model, report)
    lora = {"rank": spec.rank, "dropout": spec.dropout, "scale": spec.scale}
    linear_to_lora_layers(model, num_layers, lora, use_dora=spec.fine_tune_type == "dora")
    if spec.resume_adapter_file is not None:
        model.load_weights(spec.resume_adapter_file, strict=False)

    folder = Path(out) / ADAPTER_DIR
    folder.mkdir(parents=True, exist_ok=True)
    config = {k: getattr(spec, k) for k in spec.__dataclass_fields__}
    config.update(hp, num_layers=num_layers, lora_parameters=lora, optimizer="adam")
    config.update(adapter_path=str(folder), data=spec.train_file)
    for k in ("rank", "scale", "dropout", "n_epochs", "learning_rate_multiplier"):
        config.pop(k)
    save_config(config, folder / "adapter_config.json")

    args = TrainingArgs(
        batch_size=hp["batch_size"],
        iters=hp["iters"],
        val_batches=spec.val_batches,
        steps_per_report=spec.steps_per_report,
        steps_per_eval=spec.steps_per_eval,
        steps_per_save=spec.save_every,
        max_seq_length=spec.max_seq_length,
        adapter_file=str(folder / ADAPTER_FILE),
        grad_checkpoint=spec.grad_checkpoint,
    )
    report.message(
        f"training {hp['iters']} steps on {len(train_set)} examples "
        f"(batch {hp['batch_size']}, learning rate {hp['learning_rate']:.3g})",
        **hp,
    )
    report.progress(0.0, stage="training")
    tracker = _Tracker(report, hp["iters"], folder)
    train(
        model=model,
        optimizer=optim.Adam(learning_rate=hp["learning_rate"]),
        train_dataset=train_set,
        val_dataset=valid_set,
        args=args,
        loss=guarded_loss,
        iterate_batches=tracker.batches,
        training_callback=tracker,
    )
    tracker.after_step()  # the last step's progress and checkpoint (the loop ends without us)
    check_finite_adapter(folder / ADAPTER_FILE)
    if tracker.diverged:
        raise JobError("nonfinite_loss", f"the training loss became NaN or infinite by step "
                       f"{tracker.steps}; try a lower learning rate")  # fmt: skip
    report.progress(tracker.steps / hp["iters"], stage="stopped" if tracker.stopped else "done")
    return {
        "adapter_path": str(folder),
        "trained_tokens": tracker.tokens,
        "steps": tracker.steps,
        "stopped": tracker.stopped,
        "train_loss": tracker.latest.get("train_loss"),
        "valid_loss": tracker.latest.get("valid_loss"),
        "hyperparameters": hp,
    }
