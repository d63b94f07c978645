"""distlab.conventions without Keras: names resolve to torch optimizers that step by Keras's
update rules with Keras's defaults, Keras loss names compute Keras's formulas, and each bad input
is one line naming it."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F  # noqa: N812

from distlab.conventions import (
    DEFAULT_OPTIMIZER,
    KerasLoss,
    OptimizerSpec,
    keras_loss,
    optimizer_spec,
    resolve,
)
from distlab.errors import LaunchError
from distlab.keras_optim import KerasOptimizer


def _params():
    return [torch.nn.Parameter(torch.ones(3))]


def test_names_build_torch_optimizers_with_keras_defaults_and_lr_overrides():
    adam = optimizer_spec("Adam")(_params())
    assert isinstance(adam, KerasOptimizer) and adam.kind == "adam"
    assert adam.defaults["lr"] == 1e-3 and adam.defaults["epsilon"] == 1e-7
    assert adam.defaults["betas"] == (0.9, 0.999)  # what lr scaling reads as Adam-like
    sgd = optimizer_spec("sgd", lr=0.5)(_params())
    assert sgd.kind == "sgd" and sgd.defaults["lr"] == 0.5
    assert optimizer_spec("sgd", lr=0.5).describe() == "SGD(learning_rate=0.5)"
    assert DEFAULT_OPTIMIZER.describe() == "Adam(learning_rate=0.001) (distlab's default)"
    assert optimizer_spec(lambda ps: torch.optim.SGD(ps, lr=1.0)) is None  # a factory stays the user's


def _one_step(spec: OptimizerSpec, p0: float, g: float) -> float:
    p = torch.nn.Parameter(torch.tensor([p0]))
    p.grad = torch.tensor([g])
    spec([p]).step()
    return p.item()


def test_rmsprop_and_adagrad_divide_by_the_root_of_v_plus_epsilon_as_keras_does():
    """Keras's RMSprop and Adagrad step by lr * g / sqrt(v + eps) (torch's by lr * g / (sqrt(v) + eps));
    with a gradient of 1e-4 the two differ about 3x, so the first step shows which."""
    g, lr, eps = 1e-4, 0.01, 1e-7
    v = 0.1 * g * g  # RMSprop's first velocity: (1 - rho) * g^2, rho = 0.9
    rms = _one_step(OptimizerSpec("rmsprop", (("learning_rate", lr),)), 1.0, g)
    assert rms == pytest.approx(1.0 - lr * g / (v + eps) ** 0.5, abs=1e-7)
    assert abs(rms - (1.0 - lr * g / (v**0.5 + eps))) > 1e-3  # torch's rule: far off
    ada = OptimizerSpec("adagrad", (("learning_rate", lr), ("initial_accumulator_value", 0.0)))
    assert _one_step(ada, 1.0, g) == pytest.approx(1.0 - lr * g / (g * g + eps) ** 0.5, abs=1e-7)


def test_adam_puts_epsilon_before_the_bias_correction_and_decays_weights_as_keras_does():
    """Keras's Adam: alpha = lr * sqrt(1 - b2^t) / (1 - b1^t), step m * alpha / (sqrt(v) + eps),
    after the decoupled decay var -= var * wd * lr (keras base_optimizer._apply_weight_decay)."""
    g, lr, eps, wd, p0 = 1e-4, 0.01, 1e-7, 0.5, 2.0
    m, v = 0.1 * g, 0.001 * g * g
    alpha = lr * (1 - 0.999) ** 0.5 / (1 - 0.9)
    decayed = p0 - p0 * wd * lr
    spec = OptimizerSpec("adam", (("learning_rate", lr), ("weight_decay", wd)))
    assert _one_step(spec, p0, g) == pytest.approx(decayed - m * alpha / (v**0.5 + eps), abs=1e-6)
    assert spec.describe() == "Adam(learning_rate=0.01, weight_decay=0.5)"
    # every kind decays the same way: a zero gradient leaves only the decay
    for kind in ("adam", "adamw", "sgd", "rmsprop", "adagrad"):
        spec = OptimizerSpec(kind, (("learning_rate", lr), ("weight_decay", wd)))
        assert _one_step(spec, p0, 0.0) == pytest.approx(decayed, abs=1e-6), kind
    # no weight decay on Adam (Keras's default): the weight moves by the step alone
    plain = OptimizerSpec("adam", (("learning_rate", lr),))
    assert _one_step(plain, p0, g) == pytest.approx(p0 - m * alpha / (v**0.5 + eps), abs=1e-6)


def test_sparse_gradients_step_the_whole_table_and_decay_reaches_rows_without_gradients():
    """An ``nn.Embedding(sparse=True)`` table: densified as Keras updates a whole table; a server
    (runtime/ps.py) finds the rows a step changed in the optimizer state, decay's rows included."""
    table = torch.nn.Embedding(4, 2, sparse=True)
    with torch.no_grad():
        table.weight.fill_(1.0)
    opt = OptimizerSpec("sgd", (("learning_rate", 0.1), ("weight_decay", 0.5)))([table.weight])
    table(torch.tensor([1])).sum().backward()
    opt.step()
    w = table.weight.detach()
    assert w[0].tolist() == pytest.approx([0.95, 0.95]) and w[1].tolist() == pytest.approx([0.85, 0.85])
    assert opt.state[table.weight]["decayed"].ne(0).any(1).all()


def test_the_default_optimizer_is_adam_and_a_factory_is_kept():
    model = torch.nn.Linear(2, 2)
    c = resolve(model, None, None)
    assert c.optimizer is DEFAULT_OPTIMIZER and c.loss is None
    factory = lambda ps: torch.optim.SGD(ps, lr=1.0)  # noqa: E731
    c = resolve(model, None, factory)
    assert c.optimizer is factory and c.optimizer_info == "<lambda> (your factory)"
    assert resolve(model, None, "sgd", lr=0.2).optimizer_info == "SGD(learning_rate=0.2)"


@pytest.mark.parametrize(
    ("call", "message"),
    [
        (lambda: optimizer_spec("adamx"), r"optimizer: 'adamx' is not an optimizer name; use one of: adam"),
        (lambda: keras_loss("cross_entropy"), r"loss: 'cross_entropy' is not a Keras loss distlab carries"),
        (
            lambda: resolve(torch.nn.Linear(2, 2), "sparse_categorical_crossentropy", None),
            r"loss: a Keras loss \(sparse_categorical_crossentropy\) for a torch model Linear",
        ),
        (
            lambda: resolve(torch.nn.Linear(2, 2), torch.nn.CrossEntropyLoss(), None, backend="tensorflow"),
            r"loss: a torch loss \(CrossEntropyLoss\) for a native TensorFlow run",
        ),
        (
            lambda: resolve(torch.nn.Linear(2, 2), None, lambda ps: None, lr=0.1),
            r"lr: sets the rate of a named or Keras optimizer",
        ),
    ],
)
def test_bad_input_is_one_line_naming_it(call, message):
    with pytest.raises(LaunchError, match=message):
        call()


def test_keras_loss_names_compute_keras_formulas():
    g = torch.Generator().manual_seed(0)
    logits, y = torch.randn(6, 4, generator=g), torch.randint(0, 4, (6,), generator=g)
    probs = logits.softmax(-1)
    sce = keras_loss("sparse_categorical_crossentropy")
    assert sce == KerasLoss("sparse_categorical_crossentropy")
    # probabilities (Keras's default, from_logits=False): the same cross-entropy as from the logits
    assert sce(probs, y).item() == pytest.approx(F.cross_entropy(logits, y).item(), rel=1e-5)
    assert keras_loss("SparseCategoricalCrossentropy")(probs, y[:, None]).item() == pytest.approx(
        F.cross_entropy(logits, y).item(), rel=1e-5
    )  # targets of shape (n, 1), as Keras takes them
    onehot = F.one_hot(y, 4).float()
    assert keras_loss("categorical_crossentropy")(probs, onehot).item() == pytest.approx(
        F.cross_entropy(logits, y).item(), rel=1e-5
    )
    out, t = torch.randn(6, 1, generator=g), torch.randn(6, generator=g)
    assert keras_loss("mse")(out, t).item() == pytest.approx(F.mse_loss(out[:, 0], t).item(), rel=1e-6)
    assert keras_loss("mae")(out, t).item() == pytest.approx(F.l1_loss(out[:, 0], t).item(), rel=1e-6)
    b = torch.randint(0, 2, (6, 1), generator=g).float()
    assert keras_loss("binary_crossentropy")(out.sigmoid(), b).item() == pytest.approx(
        F.binary_cross_entropy_with_logits(out, b).item(), rel=1e-4
    )


def test_compile_metrics_compute_as_keras_resolves_them():
    """distlab.step_metrics without Keras: "accuracy" picks sparse, categorical or binary accuracy
    from the shapes as Keras does, and each value is the batch's own."""
    from distlab.step_metrics import StepMetric, _name, resolved

    out = torch.tensor([[2.0, 0.0, 1.0], [0.0, 3.0, 1.0], [0.0, 0.0, 5.0], [4.0, 1.0, 0.0]])
    ids = torch.tensor([0, 1, 1, 2])  # two right
    assert StepMetric("accuracy")(out, ids) == 0.5
    assert StepMetric("accuracy")(out, F.one_hot(torch.tensor([0, 1, 2, 0]), 3).float()) == 1.0
    probs, labels = torch.tensor([[0.9], [0.2], [0.6]]), torch.tensor([[1.0], [1.0], [0.0]])
    assert StepMetric("accuracy")(probs, labels) == pytest.approx(1 / 3)
    assert StepMetric("mean_absolute_error")(probs, labels) == pytest.approx((0.1 + 0.8 + 0.6) / 3)
    assert resolved("accuracy", (8, 10), (8,), True) == "sparse_categorical_accuracy"
    assert resolved("accuracy", (8, 10), (8, 1), True) == "sparse_categorical_accuracy"
    assert resolved("accuracy", (8, 1), (8, 1), False) == "binary_accuracy"
    assert resolved("accuracy", (8, 10), (8, 10), False) == "categorical_accuracy"
    assert [_name(n) for n in ("acc", "MAE", "sparse_categorical_accuracy", "auc")] == [
        "accuracy",
        "mean_absolute_error",
        "sparse_categorical_accuracy",
        None,
    ]


def test_a_native_job_unpickles_without_importing_distlab_or_torch():
    """The TensorFlow child imports nothing of distlab: a job that carried distlab's KerasLoss,
    OptimizerSpec and StepMetric objects imported distlab, and with it torch, on unpickling
    (1.3-1.4 s of every native rank's start). The job carries their specs instead."""
    import subprocess
    import sys

    import cloudpickle

    from distlab.conventions import KerasLoss, OptimizerSpec
    from distlab.native_tf.launch import child_job
    from distlab.step_metrics import StepMetric

    loss = KerasLoss("sparse_categorical_crossentropy", (("from_logits", True),))
    job = child_job(5, 8, 0, True, loss, OptimizerSpec("adam"), (StepMetric("accuracy"),))
    assert job["loss"] == {"keras_loss": "SparseCategoricalCrossentropy", "options": {"from_logits": True}}
    assert job["optimizer"]["keras_optimizer"] == "Adam" and job["metrics"] == ["accuracy"]
    code = "import pickle, sys; pickle.loads(sys.stdin.buffer.read()); "
    code += "print(sorted({'distlab', 'torch'} & set(sys.modules)))"
    done = subprocess.run(
        [sys.executable, "-c", code],
        input=cloudpickle.dumps(job),
        capture_output=True,
        timeout=60,
        check=True,
    )
    assert done.stdout.decode().strip() == "[]", done.stdout
    # what the job carried until now: unpickling it there imports both
    old = cloudpickle.dumps({"loss": loss})
    done = subprocess.run(
        [sys.executable, "-c", code], input=old, capture_output=True, timeout=60, check=True
    )
    assert done.stdout.decode().strip() == "['distlab', 'torch']", done.stdout
