"""The one training loop: a Task (what the Trainer needs from a model) trained with the shared schedule, weight
decay, checkpoints, time budget and exact resume; the reader trained through it."""
import ast
from pathlib import Path

import pytest
import torch

from fastdpr.errors import InputError
from fastdpr.train import checkpoint as ckpt
from fastdpr.train import trainer as trainer_module
from fastdpr.train.schedule import run_fraction, warmup_then_decay
from fastdpr.train.task import Task
from fastdpr.train.trainer import Trainer, TrainingArguments

ROOT = Path(__file__).resolve().parent.parent


class TinyRegressor(torch.nn.Module):
    """A model with a bias, a LayerNorm and dropout (so generator states matter on resume); saves like ours."""

    def __init__(self):
        super().__init__()
        self.linear = torch.nn.Linear(4, 4)
        self.LayerNorm = torch.nn.LayerNorm(4)
        self.dropout = torch.nn.Dropout(0.2)
        self.out = torch.nn.Linear(4, 1)

    def forward(self, x):
        return self.out(self.dropout(self.LayerNorm(self.linear(x)))).squeeze(-1)

    def save_pretrained(self, path):
        Path(path).mkdir(parents=True, exist_ok=True)
        torch.save(self.state_dict(), Path(path) / "weights.pt")

    @classmethod
    def from_pretrained(cls, path):
        model = cls()
        model.load_state_dict(torch.load(Path(path) / "weights.pt"))
        return model


class RegressionTask(Task):
    """12 examples of y = sum(x), in batches of 3; each step advances ``clock`` (when given) by one second."""

    def __init__(self, clock=None):
        torch.manual_seed(0)
        self.model = TinyRegressor()
        generator = torch.Generator().manual_seed(1)
        self.x = torch.randn(12, 4, generator=generator)
        self.y = self.x.sum(1)
        self.batches_per_epoch = 4
        self.last_parts = {}
        self.clock = clock

    def batch(self, epoch, position, step):
        order = torch.randperm(12, generator=torch.Generator().manual_seed(epoch))
        return order[position * 3 : position * 3 + 3]

    def step(self, trainer, batch):
        if self.clock is not None:
            self.clock.now += 1.0
        with trainer.autocast():
            loss = torch.nn.functional.mse_loss(self.model(self.x[batch]).float(), self.y[batch])
        trainer.backward(loss)
        self.last_parts = {"half": float(loss.detach()) / 2}
        return loss.detach()


def _args(out, **kw):
    base = dict(output_dir=None if out is None else str(out), batch_size=3, epochs=2, lr=1e-2, warmup_steps=2,
                weight_decay=0.1, show_progress=False, logging_steps=1, seed=7)
    base.update(kw)
    return TrainingArguments(**base)


class Interrupt(Exception):
    pass


def _weights(model):
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


class FakeClock:
    """perf_counter of the trainer: moves only when a step says so."""

    def __init__(self):
        self.now = 0.0

    def perf_counter(self):
        return self.now

    @staticmethod
    def process_time():
        return 0.0


def test_a_task_resumes_to_the_same_weights_as_an_uninterrupted_run(tmp_path):
    straight = RegressionTask()
    Trainer(straight, _args(tmp_path / "straight")).train()

    def stop_at_5(trainer, record):
        if record["step"] == 5:
            raise Interrupt

    first = RegressionTask()
    with pytest.raises(Interrupt):
        Trainer(first, _args(tmp_path / "run", save_steps=1), callbacks=[stop_at_5]).train()
    assert ckpt.latest_checkpoint(tmp_path / "run").name == "step-00000005"
    resumed = RegressionTask()
    result = Trainer(resumed, _args(tmp_path / "run", save_steps=1)).train(resume=True)
    assert result["step"] == 8 and result["examples_seen"] == 24
    for (name, a), b in zip(_weights(straight.model).items(), _weights(resumed.model).values()):
        torch.testing.assert_close(a, b, msg=name)
    # the interrupted run really moved the weights (the comparison above is not between untrained models)
    assert not torch.equal(straight.model.linear.weight, RegressionTask().model.linear.weight)


def test_the_schedule_factor_and_run_fraction():
    for done, warmup, factor in [(0.0, 0.1, 0.0), (0.05, 0.1, 0.5), (0.1, 0.1, 1.0), (0.55, 0.1, 0.5),
                                 (1.0, 0.1, 0.0), (0.5, 0.0, 0.5)]:
        assert warmup_then_decay(done, warmup) == pytest.approx(factor)
    assert run_fraction(3, 10, elapsed_s=5.0, time_budget_s=10.0) == pytest.approx(0.5)
    assert run_fraction(3, None, elapsed_s=2.0, time_budget_s=10.0) == pytest.approx(0.2)


def test_rates_over_a_run_follow_the_reference_schedule(tmp_path):
    from transformers import get_linear_schedule_with_warmup

    seen = []
    Trainer(RegressionTask(), _args(None, epochs=2, warmup_steps=3),
            callbacks=[lambda trainer, record: seen.append(record["lr"])]).train()
    reference = get_linear_schedule_with_warmup(torch.optim.SGD([torch.zeros(1, requires_grad=True)], lr=1e-2), 3, 8)
    expected = []
    for _ in range(8):
        reference.optimizer.step()
        reference.step()
        expected.append(reference.get_last_lr()[0])
    assert seen == pytest.approx(expected, abs=1e-12)


def test_no_weight_decay_on_biases_and_layer_norms():
    trainer = Trainer(RegressionTask(), _args(None))
    trainer._setup()
    groups = {g["weight_decay"]: {id(p) for p in g["params"]} for g in trainer.optimizer.param_groups}
    model = trainer.model
    assert groups[0.1] == {id(model.linear.weight), id(model.out.weight)}
    assert groups[0.0] == {id(model.linear.bias), id(model.out.bias), id(model.LayerNorm.weight),
                           id(model.LayerNorm.bias)}


def test_a_time_budget_stops_the_run_and_decays_the_rate_to_zero(tmp_path, monkeypatch):
    clock = FakeClock()
    monkeypatch.setattr(trainer_module, "time", clock)
    seen = []
    trainer = Trainer(RegressionTask(clock), _args(None, epochs=0, time_budget_s=5.0, warmup_steps=0.2),
                      callbacks=[lambda trainer, record: seen.append((record["step"], record["lr"]))])
    result = trainer.train()
    assert result["step"] == 5 and result["stopped_by"] == "time" and result["seconds"] == pytest.approx(5.0)
    # one second per step of five: warm-up to 1.0 at 1 s, then down by a quarter per second to zero
    assert [lr for _, lr in seen] == pytest.approx([1e-2, 0.75e-2, 0.5e-2, 0.25e-2, 0.0])
    # both bounds: whichever comes first stops the run
    steps = Trainer(RegressionTask(clock), _args(None, max_steps=3, time_budget_s=5.0)).train()
    assert steps["step"] == 3 and steps["stopped_by"] == "steps"


def test_checkpoints_by_the_clock(tmp_path, monkeypatch):
    clock = FakeClock()
    monkeypatch.setattr(trainer_module, "time", clock)
    saved = []
    monkeypatch.setattr(Trainer, "save_checkpoint", lambda self: saved.append(self.state["step"]))
    Trainer(RegressionTask(clock), _args(tmp_path, max_steps=7, epochs=0, save_every_s=3.0)).train()
    assert saved == [3, 6, 7]  # every 3 s of clock, and at the end


def test_without_an_output_directory_nothing_is_written(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    result = Trainer(RegressionTask(), _args(None, max_steps=2)).train()
    assert result["step"] == 2 and list(tmp_path.iterdir()) == []
    with pytest.raises(InputError, match="no checkpoint"):
        Trainer(RegressionTask(), _args(None)).train(resume=True)


def test_a_checkpoint_of_another_model_is_refused_by_name(tmp_path):
    Trainer(RegressionTask(), _args(tmp_path, max_steps=1)).train()
    other = RegressionTask()
    other.model.out = torch.nn.Linear(4, 2)  # other shapes
    with pytest.raises(InputError, match="not a state of the training asked for") as err:
        Trainer(other, _args(tmp_path, max_steps=2)).train(resume=True)
    assert str(tmp_path) in str(err.value)


def test_arguments_bound_the_run():
    with pytest.raises(InputError, match="epochs"):
        TrainingArguments(output_dir=None, epochs=0)
    with pytest.raises(InputError, match="time_budget_s"):
        TrainingArguments(output_dir=None, time_budget_s=0)
    with pytest.raises(InputError, match="warm-up"):
        Trainer(RegressionTask(), _args(None, epochs=0, time_budget_s=5.0, warmup_steps=3))._setup()


def test_the_task_parts_of_a_step_reach_the_callbacks():
    records = []
    Trainer(RegressionTask(), _args(None, max_steps=2), callbacks=[lambda t, r: records.append(r)]).train()
    assert [r["half"] for r in records] == pytest.approx([r["loss"] / 2 for r in records])


class ValidatedTask(RegressionTask):
    """A RegressionTask whose validation gives the next of ``scores`` under ``metric``."""

    def __init__(self, scores, higher_is_better, with_data=True):
        super().__init__()
        self.scores = list(scores)
        self.best_metric, self.higher_is_better = "score", higher_is_better
        self.with_data = with_data
        self.validated_at = []

    @property
    def has_validation_data(self):
        return self.with_data

    def validate(self, trainer):
        self.validated_at.append(trainer.state["step"])
        return {"score": self.scores[len(self.validated_at) - 1], "other": 0.0}


@pytest.mark.parametrize("higher, best_step", [(True, 4), (False, 2)])
def test_any_task_is_validated_on_the_schedule_and_its_metric_picks_the_best(tmp_path, higher, best_step):
    import json

    task = ValidatedTask([0.2, 0.5, 0.3], higher_is_better=higher)
    result = Trainer(task, _args(tmp_path, max_steps=6, eval_steps=2)).train()
    assert task.validated_at == [2, 4, 6]
    assert result["best_step"] == best_step and result["best"] == {2: 0.2, 4: 0.5}[best_step]
    kept = json.loads((tmp_path / "best" / "validation.json").read_text())
    assert kept["step"] == best_step and kept["metric"] == "score"
    logged = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [r["dev_score"] for r in logged if "dev_score" in r] == [0.2, 0.5, 0.3]


def test_a_task_without_validation_data_is_not_validated(tmp_path):
    task = ValidatedTask([], higher_is_better=True, with_data=False)
    result = Trainer(task, _args(tmp_path, max_steps=4, eval_steps=2)).train()
    assert task.validated_at == [] and result["best_step"] is None and not (tmp_path / "best").exists()


def test_a_validation_without_the_task_metric_is_named(tmp_path):
    task = ValidatedTask([0.1], higher_is_better=True)
    task.best_metric = "accuracy"
    with pytest.raises(InputError, match="not its best_metric 'accuracy'"):
        Trainer(task, _args(None, max_steps=2, eval_steps=2)).train()


def test_the_trainer_takes_a_task_only():
    with pytest.raises(InputError, match="trains a fastdpr.train.task.Task"):
        Trainer(TinyRegressor(), _args(None))


def test_resume_reads_the_arguments_of_the_earlier_flat_layout(tmp_path):
    import json

    def stop_at_5(trainer, record):
        if record["step"] == 5:
            raise Interrupt

    with pytest.raises(Interrupt):
        Trainer(RegressionTask(), _args(tmp_path, save_steps=1), callbacks=[stop_at_5]).train()
    saved = json.loads((tmp_path / "training_args.json").read_text())
    assert saved["training"]["batch_size"] == 3 and saved["task"] == {} and saved["world_size"] == 1
    # the layout before the loop's and the dual encoder's settings were split: one flat dict of both
    flat = {**saved["training"], "n_hard": 1, "grad_cache": False, "world_size": 1}
    (tmp_path / "training_args.json").write_text(json.dumps(flat))
    assert trainer_module.read_arguments(tmp_path / "training_args.json") == {
        "training": saved["training"], "task": {"n_hard": 1, "grad_cache": False}}
    result = Trainer(RegressionTask(), _args(tmp_path, save_steps=1)).train(resume=True)
    assert result["step"] == 8
    assert "training" in json.loads((tmp_path / "training_args.json").read_text())  # rewritten in the new layout


@pytest.mark.parametrize("changed", [dict(batch_size=4), dict(seed=8)])
def test_resume_refuses_settings_that_take_other_examples(tmp_path, changed):
    Trainer(RegressionTask(), _args(tmp_path, max_steps=1)).train()
    name = next(iter(changed))
    with pytest.raises(InputError, match=f"{name} .* of the run being resumed") as err:
        Trainer(RegressionTask(), _args(tmp_path, max_steps=2, **changed)).train(resume=True)
    assert "training_args.json" in str(err.value)


def test_the_trainer_imports_no_task():
    tree = ast.parse((ROOT / "fastdpr" / "train" / "trainer.py").read_text())
    imported = {node.module for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)}
    imported |= {alias.name for node in ast.walk(tree) if isinstance(node, ast.Import) for alias in node.names}
    task_modules = {"fastdpr.train.biencoder", "fastdpr.train.data", "fastdpr.train.loss", "fastdpr.train.grad_cache",
                    "fastdpr.train.pool", "fastdpr.models", "fastdpr.models.biencoder"}
    assert not imported & task_modules
    assert not any(m.startswith("fastdpr.reader") for m in imported)


def test_the_reader_modules_import_each_other_one_way_only():
    """reader/model.py may reach reader/training.py (Reader.fit); training never reaches back to the model."""
    tree = ast.parse((ROOT / "fastdpr" / "reader" / "training.py").read_text())
    imported = {node.module for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)}
    imported |= {alias.name for node in ast.walk(tree) if isinstance(node, ast.Import) for alias in node.names}
    assert "fastdpr.reader.model" not in imported and "fastdpr.reader" not in imported
    assert not (ROOT / "fastdpr" / "reader" / "model.py").read_text().count("def autocast")


READER_EXAMPLES = [
    {"question": "what is the capital of france", "answers": ["paris"],
     "ctxs": [{"id": "a", "title": "", "text": "paris is the capital city of france"},
              {"id": "b", "title": "", "text": "the river runs north to the sea"}]},
    {"question": "where did the king live", "answers": ["london"],
     "ctxs": [{"id": "c", "title": "", "text": "the king of england lived in london"},
              {"id": "d", "title": "", "text": "paris is the capital city of france"}]},
]


def test_reader_fit_keeps_its_time_budget_and_resumes_by_the_clock(tmp_path, monkeypatch):
    from fastdpr.reader import Reader
    from fastdpr.reader.training import ReaderTask
    from tiny_models import tiny_bert_dir

    clock = FakeClock()
    monkeypatch.setattr(trainer_module, "time", clock)
    step = ReaderTask.step

    def timed_step(self, trainer, batch):  # each reader step takes two seconds of the fake clock
        clock.now += 2.0
        return step(self, trainer, batch)

    monkeypatch.setattr(ReaderTask, "step", timed_step)
    model_dir = tiny_bert_dir(tmp_path / "m", dropout=0.1)

    def fresh():
        torch.manual_seed(0)
        return Reader.from_pretrained(model_dir, max_length=48)

    straight = fresh()
    stats = straight.fit(READER_EXAMPLES, epochs=None, time_budget_s=9.0, batch_size=1, lr=1e-3, show_progress=False)
    assert stats["steps"] == 5 and stats["stopped_by"] == "time" and stats["seconds"] == pytest.approx(10.0)

    def stop_at_2(stats, _reader):
        if stats["step"] == 2:
            raise Interrupt

    first = fresh()
    with pytest.raises(Interrupt):
        first.fit(READER_EXAMPLES, epochs=None, time_budget_s=9.0, batch_size=1, lr=1e-3, show_progress=False,
                  checkpoint_dir=tmp_path / "ckpt", checkpoint_every_s=4.0, callback=stop_at_2, callback_every=1)
    assert ckpt.latest_checkpoint(tmp_path / "ckpt").name == "step-00000002"  # saved at 4 s of the clock
    resumed = fresh()
    again = resumed.fit(READER_EXAMPLES, epochs=None, time_budget_s=9.0, batch_size=1, lr=1e-3, show_progress=False,
                        checkpoint_dir=tmp_path / "ckpt", checkpoint_every_s=4.0)
    assert again["steps"] == 5 and again["seconds"] == pytest.approx(10.0) and again["examples_seen"] == 5
    # dropout on: equal weights need the generator states of the checkpoint, not only its weights
    for (name, a), b in zip(straight.state_dict().items(), resumed.state_dict().values()):
        torch.testing.assert_close(a, b, msg=name)


def test_reader_fit_has_its_loop_settings_checked_before_its_groups_are_prepared(tmp_path, monkeypatch):
    from fastdpr.reader import Reader
    from fastdpr.reader import training
    from tiny_models import tiny_bert_dir

    reader = Reader.from_pretrained(tiny_bert_dir(tmp_path / "m"), max_length=48)
    monkeypatch.setattr(training, "prepare_groups", lambda *a, **k: pytest.fail("groups prepared first"))
    with pytest.raises(InputError, match="attention_dropout"):
        reader.fit(READER_EXAMPLES, attention_dropout=1.0, show_progress=False)
    with pytest.raises(InputError, match="time_budget_s"):
        reader.fit(READER_EXAMPLES, time_budget_s=0.0, show_progress=False)
    with pytest.raises(InputError, match="batch_size"):
        reader.fit(READER_EXAMPLES, batch_size=0, show_progress=False)
