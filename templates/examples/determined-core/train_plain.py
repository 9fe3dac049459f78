"""A Determined Core API training script, as Determined's Core API tutorials write one.

A tiny regression MLP on synthetic data, CPU only, a fraction of a second per batch:
hyperparameters from the cluster info, metrics, a checkpoint every `checkpoint_every`
batches, resume from the latest checkpoint, a preemption check after each checkpoint,
and the searcher's operations deciding how long to train.

Batches are drawn by their index (`torch.Generator().manual_seed(batch)`), so a run
resumed from a checkpoint trains on exactly the batches an uninterrupted run would.
"""

import logging
import pathlib
import time

import determined as det
import torch


def make_data(seed):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(640, 8, generator=g)
    w = torch.randn(8, 1, generator=g)
    y = torch.tanh(x @ w) + 0.05 * torch.randn(640, 1, generator=g)
    return x[:512], y[:512], x[512:], y[512:]


def batch_at(x, y, batch, size):
    order = torch.randperm(len(x), generator=torch.Generator().manual_seed(batch))
    idx = order[:size]
    return x[idx], y[idx]


def save_state(model, opt, batches, trial_id, path):
    state = {"model": model.state_dict(), "opt": opt.state_dict(), "batches": batches}
    torch.save({**state, "trial_id": trial_id}, pathlib.Path(path) / "state.pt")


def load_state(model, opt, trial_id, path):
    state = torch.load(pathlib.Path(path) / "state.pt", weights_only=True)
    model.load_state_dict(state["model"])
    opt.load_state_dict(state["opt"])
    # a checkpoint of another trial (a "continue" from it) keeps the weights only
    return state["batches"] if state["trial_id"] == trial_id else 0


def main(core_context, latest_checkpoint, trial_id, hparams, seed):
    torch.manual_seed(seed)
    hidden = hparams["hidden"]
    model = torch.nn.Sequential(
        torch.nn.Linear(8, hidden), torch.nn.Tanh(), torch.nn.Linear(hidden, 1)
    )
    opt = torch.optim.SGD(model.parameters(), lr=hparams["lr"], momentum=0.9)
    x, y, x_val, y_val = make_data(hparams["data_seed"])
    every = hparams["checkpoint_every"]

    batches = 0
    if latest_checkpoint is not None:
        with core_context.checkpoint.restore_path(latest_checkpoint) as path:
            batches = load_state(model, opt, trial_id, path)
        logging.info(f"resumed at batch {batches} from {latest_checkpoint}")

    for op in core_context.searcher.operations():
        while batches < op.length:
            xb, yb = batch_at(x, y, batches, hparams["batch_size"])
            loss = torch.nn.functional.mse_loss(model(xb), yb)
            opt.zero_grad()
            loss.backward()
            opt.step()
            batches += 1
            time.sleep(hparams["step_sleep"])
            if batches % every == 0 and batches < op.length:
                core_context.train.report_training_metrics(
                    steps_completed=batches, metrics={"loss": loss.item()}
                )
                op.report_progress(batches)
                with core_context.checkpoint.store_path({"steps_completed": batches}) as (path, _):
                    save_state(model, opt, batches, trial_id, path)
                if core_context.preempt.should_preempt():
                    return

        with torch.no_grad():
            val_loss = torch.nn.functional.mse_loss(model(x_val), y_val).item()
        core_context.train.report_validation_metrics(
            steps_completed=batches, metrics={"val_loss": val_loss}
        )
        op.report_completed(val_loss)
        with core_context.checkpoint.store_path({"steps_completed": batches}) as (path, _):
            save_state(model, opt, batches, trial_id, path)


if __name__ == "__main__":
    logging.basicConfig(level=logging.INFO, format=det.LOG_FORMAT)
    info = det.get_cluster_info()
    assert info is not None, "this example only runs on-cluster"
    with det.core.init() as core_context:
        main(
            core_context=core_context,
            latest_checkpoint=info.latest_checkpoint,
            trial_id=info.trial.trial_id,
            hparams=info.trial.hparams,
            seed=info.trial.trial_seed,
        )
