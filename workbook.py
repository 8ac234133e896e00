"""What gpt_numpy.py, the lesson, is used with, in NumPy alone: sampling, AdamW and Muon, the
check's table, the workbook of exercises and the demo's command line (python gpt_numpy.py ...)."""
import argparse
import ast
import contextlib
import difflib
import importlib.util
import json
import math
import os
import re
import shlex
import signal
import sys
import textwrap
import threading
import time
import traceback
import unicodedata

import numpy as np

import gpt_numpy

HERE = os.path.dirname(os.path.abspath(__file__))
# The logits gpt.py gives the check's two models with fixed_weights (fixtures/make_twin_logits.py).
KNOWN_LOGITS = os.path.join(HERE, "fixtures", "twin_logits.json")


# --------------------------------------------------------------------------------------- sampling
def generate(model, idx, max_new_tokens, temperature=1.0, top_k=None, top_p=None, generator=None):
    """gpt.GPT.generate for a gpt_numpy.GPT, without a KV cache: each token from a full forward over
    the last block_size tokens. generator: np.random.default_rng(seed), to repeat a sample."""
    generator = generator or np.random.default_rng()
    for _ in range(max_new_tokens):
        window = idx[:, -model.config.block_size:]
        logits = model.forward(window)[0][:, -1, :].astype(np.float64)  # (B, vocab_size)
        if temperature == 0:
            next_id = logits.argmax(-1)
        else:
            # As gpt.py: less the max, over a temperature of at least 1e-30.
            logits = (logits - logits.max(-1, keepdims=True)) / max(temperature, 1e-30)
            probs = gpt_numpy.softmax_forward(filter_logits(logits, top_k, top_p))[0]
            next_id = np.array([generator.choice(len(row), p=row) for row in probs])
        idx = np.concatenate([idx, next_id[:, None]], axis=1)
    return idx


def filter_logits(logits, top_k=None, top_p=None):
    """gpt.filter_logits: -inf for each logit outside the top_k, then outside the nucleus, the
    fewest likeliest tokens whose probability reaches top_p. The likeliest token always stays."""
    if top_k is not None:
        kth = np.sort(logits, axis=-1)[..., -min(top_k, logits.shape[-1]), None]  # (B, 1)
        logits = np.where(logits < kth, -np.inf, logits)
    if top_p is not None:
        # The likeliest first.
        order = np.argsort(-logits, axis=-1, kind="stable")
        probs = np.take_along_axis(gpt_numpy.softmax_forward(logits)[0], order, axis=-1)
        # A token goes when those before it already reach top_p; the likeliest stays.
        drop_sorted = probs.cumsum(-1) - probs >= top_p
        drop_sorted[..., 0] = False
        drop = np.empty(logits.shape, dtype=bool)
        np.put_along_axis(drop, order, drop_sorted, axis=-1)
        logits = np.where(drop, -np.inf, logits)
    return logits


# ------------------------------------------------------------------------------------- optimizers
class AdamW:
    """torch.optim.AdamW, step for step, with gpt.py's grouping: weight decay on matrices only."""

    def __init__(self, params, lr, weight_decay=0.1, betas=(0.9, 0.99), eps=1e-8):
        self.params = params
        self.lr = lr
        self.weight_decay = weight_decay
        self.betas = betas
        self.eps = eps
        self.m = {name: np.zeros_like(w) for name, w in params.items()}
        self.v = {name: np.zeros_like(w) for name, w in params.items()}
        self.t = 0

    def step(self, grads):
        self.t += 1
        b1, b2 = self.betas
        for name, w in self.params.items():
            g = grads[name]
            # Decoupled: the decay shrinks the weight, and never enters the moments.
            if w.ndim >= 2:
                w *= 1 - self.lr * self.weight_decay
            self.m[name] = b1 * self.m[name] + (1 - b1) * g
            self.v[name] = b2 * self.v[name] + (1 - b2) * g * g
            # Bias correction undoes the moments' start at zero.
            denom = np.sqrt(self.v[name]) / math.sqrt(1 - b2 ** self.t) + self.eps
            w -= self.lr / (1 - b1 ** self.t) * self.m[name] / denom


def newton_schulz(g, steps=5):
    """About U V^T for g = U S V^T: g's directions, each singular value pushed to about 1. Muon's
    update, as torch.optim.Muon computes it (in bfloat16 there, in g's own type here)."""
    # A gradient matrix is dominated by a few directions, its largest singular values, and momentum
    # SGD moves the weights mostly along those. Muon moves along every direction the gradient names
    # by about the same amount. An SVD per step would be slow. An odd polynomial of x,
    # a x + b (x x^T) x + c (x x^T)^2 x, acts on each singular value s alone: a s + b s^3 + c s^5.
    # Five rounds of this one carry every s between 0.003 and 1 (after the scaling below) to
    # between 0.68 and 1.2: not exactly 1, which does no harm, in a few matrix products.
    a, b, c = 3.4445, -4.7750, 2.0315
    wide = g.shape[0] <= g.shape[1]
    # (m, n) with m <= n, so that x x^T is the smaller of the two products.
    x = g if wide else g.T
    # The Frobenius norm is at least the largest singular value: every s starts in [0, 1].
    x = x / max(np.linalg.norm(x), 1e-7)
    for _ in range(steps):
        gram = x @ x.T  # (m, m)
        x = a * x + (b * gram + c * gram @ gram) @ x  # (m, n)
    return x if wide else x.T


class Muon:
    """torch.optim.Muon, step for step (Nesterov momentum, its default), for the matrices gpt.py
    gives it: the blocks' 2-D weights. The rest stays with AdamW."""

    def __init__(self, params, lr=0.01, weight_decay=0.1, momentum=0.95):
        self.params = params
        self.lr = lr
        self.weight_decay = weight_decay
        self.momentum = momentum
        self.buf = {name: np.zeros_like(w) for name, w in params.items()}

    def step(self, grads):
        mu = self.momentum
        for name, w in self.params.items():
            g = grads[name]
            self.buf[name] = mu * self.buf[name] + (1 - mu) * g
            # Nesterov: the step looks ahead, along the gradient mixed once more with the momentum.
            update = newton_schulz((1 - mu) * g + mu * self.buf[name])
            # Scaled by sqrt(rows / columns) where taller than wide, the update's entries are about
            # 1 / sqrt(columns) in size, whatever the matrix's shape.
            lr = self.lr * math.sqrt(max(1, w.shape[0] / w.shape[1]))
            w *= 1 - self.lr * self.weight_decay
            w -= lr * update




# -------------------------------------------------------------------------------------- the check
# Asides on gpt_numpy.py that are not the lesson, on speed and on matching PyTorch:
# - linear_forward flattens x to one (B*T, in) @ (in, out) product: NumPy would run a (B, T, in)
#   one as B small products, many times slower. gelu_forward writes x * x * x: x ** 3 is far slower.
# - rope_tables rounds its float64 angles' cos and sin through float32, as gpt.py stores them, so
#   that the two agree in float32.
# - test_gpt.py holds every gradient of gpt_numpy.py to PyTorch's autograd, within 1e-10 in float64.

# A float64 gradient is judged to 1e-6 of its scale: the finite differences' own error (h^2, and
# float64's rounding over h) is far below it. A gradient computed in float32 carries float32's
# rounding too, up to eps = 2^-23 (1.2e-7) of the scale at each operation, and a right one is
# only as close as those roundings allow: sums of a few hundred terms, through a dozen layers.
# 1000 eps (1.2e-4) bounds a thousand roundings that all err the same way: a right float32 answer
# here is within about 13 eps (1.5e-6), and each slip of the workbook (a factor, a sign, a lost
# term) puts every row it turns 3e-3 or more off.
FLOAT32_TOLERANCE = 1000 * float(np.finfo(np.float32).eps)


def less_precise(arrays):
    """The dtype of the first of arrays that is a float of less precision than float64; None if
    none is."""
    return next((a.dtype for a in arrays if isinstance(a, (np.ndarray, np.generic))
                 and a.dtype.kind in "fc" and np.finfo(a.dtype).eps > np.finfo(np.float64).eps), None)


def tolerance_for(tolerance, arrays):
    """The tolerance in force for gradients computed as the arrays are: FLOAT32_TOLERANCE (or
    tolerance, where more) where one is a float of less precision than float64, else tolerance."""
    return tolerance if less_precise(arrays) is None else max(tolerance, FLOAT32_TOLERANCE)


class Row:
    """One row of the check: a gradient's name and its largest relative error against finite
    differences, ok when at most the tolerance, else WRONG with what kind of wrong; or ERROR, with
    the one line of the exception raised and where in the learner's code. A problem (a backward
    that changed its dout in place) makes the row WRONG whatever its error."""

    def __init__(self, name, error=math.inf, tolerance=1e-6, raised=None, detail="", problem=None):
        self.name = name
        self.error = error
        self.tolerance = tolerance
        self.raised = raised
        self.detail = detail
        self.problem = problem

    @property
    def verdict(self):
        if self.raised is not None:
            return "ERROR"
        return "ok" if self.error <= self.tolerance and self.problem is None else "WRONG"

    def __str__(self):
        if self.raised is not None:
            return f"{self.name:44s} {'':14s}  ERROR  {self.raised}"
        detail = self.detail if self.error > self.tolerance else ""
        said = "; ".join(text for text in (self.problem, detail) if text)
        detail = f"  {said}" if self.verdict == "WRONG" and said else ""
        # A float32 gradient's row says that it is judged to float32's tolerance.
        if self.tolerance == FLOAT32_TOLERANCE:
            detail += f"  (in float32: to {self.tolerance:.1e})"
        return f"{self.name:44s} {self.error:14.1e}  {self.verdict}{detail}"

    def __repr__(self):
        if self.raised is not None:
            return f"{self.name}: ERROR ({self.raised})"
        return f"{self.name}: {self.verdict} ({self.error:.1e}, at most {self.tolerance:g})"


def compared(name, ours, reference, tolerance, scale=None, versus="finite differences"):
    """The Row of a gradient against finite differences, saying how it is wrong when it is."""
    error = gpt_numpy.rel_error(ours, reference, scale)
    return Row(name, error, tolerance, detail=how_wrong(ours, reference, versus, scale, tolerance))


def factor_of(ours, reference):
    """"the sign flipped" or "F times the right one" when ours is the right one times a constant, to
    within the differences' own error; else None. A factor of about 1 says nothing."""
    norm = reference @ reference
    if not norm > 0:
        return None
    factor = (ours @ reference) / norm
    close = np.abs(ours - factor * reference).max() <= 1e-5 * np.abs(ours).max()
    if close and abs(factor - 1) > 1e-3:
        return "the sign flipped" if abs(factor + 1) < 1e-6 else f"{factor:.4g} times the right one"
    return None


def how_wrong(ours, reference, versus="finite differences", scale=None, tolerance=1e-6):
    """A wrong gradient's kind in a few words: a constant factor from the right one when it is one
    (the sign, a missing 1/N), else where it differs (by more than tolerance of the scale): how
    many entries, and the index of the largest difference, [b, t, c], with the two values there."""
    shape = np.shape(reference)
    ours = np.asarray(ours, dtype=np.float64).ravel()
    reference = np.asarray(reference, dtype=np.float64).ravel()
    if not np.isfinite(reference).all():
        return "the forward gives NaN or inf"
    if not np.isfinite(ours).all():
        return "it holds NaN or inf"
    if not np.abs(ours).max() > 0:
        return "it is all zeros"
    said = factor_of(ours, reference)
    if said is not None:
        return said
    largest = scale or max(np.abs(ours).max(), np.abs(reference).max())
    differ = np.abs(ours - reference) > tolerance * largest
    i = int(np.argmax(np.abs(ours - reference)))
    at = ", ".join(str(int(j)) for j in np.unravel_index(i, shape)) if shape else ""
    return (f"{differ.sum()} of {ours.size} entries differ, the most at [{at}]: ours "
            f"{ours[i]:.6g} vs {versus} {reference[i]:.6g}")


def raised_here(error, twin, function=None):
    """An exception in one line: its type, its message's first line and, where it passed through
    twin's file (the learner's code), the function and the file:line where it last did; or, where
    it passed through function (the learner's, "GPT.backward"), the line of function that called
    the helper it raised in."""
    lines = str(error).strip().splitlines()
    said = f"{type(error).__name__}: {lines[0] if lines else ''}"
    source = os.path.abspath(getattr(twin, "__file__", "") or "")
    ours = [frame for frame in traceback.extract_tb(error.__traceback__)
            if os.path.abspath(frame.filename) == source]
    if function is not None:
        called = [frame for frame in ours if frame.name == function.split(".")[-1]]
        if called and called[-1] is not ours[-1]:
            return (f"{said} (in {ours[-1].name}, called from {called[-1].name}, "
                    f"{os.path.basename(source)}:{called[-1].lineno})")
    if ours:
        said += f" (in {ours[-1].name}, {os.path.basename(source)}:{ours[-1].lineno})"
    return said


def passed_through(error, twin):
    """Whether error was raised in, or passed through, twin's file (the learner's code)."""
    source = os.path.abspath(getattr(twin, "__file__", "") or "")
    return any(os.path.abspath(frame.filename) == source
               for frame in traceback.extract_tb(error.__traceback__))


def learners_function(twin):
    """The function whose body a learner writes in twin, an exercise's copy (exercise_N.py), as
    the workbook names it ("GPT.backward"); None for any other file."""
    ex = learners_exercise(twin)
    return ex["function"] if ex else None


def learners_exercise(twin):
    """The exercise whose copy twin is (exercise_N.py), from the workbook; None for any other."""
    name = os.path.basename(getattr(twin, "__file__", "") or "")
    number = name[len("exercise_"):-len(".py")]
    if not (name.startswith("exercise_") and name.endswith(".py") and number.isdecimal()):
        return None
    try:
        found = exercises()
    except ValueError:
        return None
    return found[int(number) - 1] if 1 <= int(number) <= len(found) else None


def arrays_in(value, label):
    """[(label, array)] for every array in value, a backward's dout or saved: a namedtuple's by
    field, a tuple's, list's or dict's by index, nested as deep as they go."""
    if isinstance(value, np.ndarray):
        return [(label, value)]
    if isinstance(value, tuple) and hasattr(value, "_fields"):
        items = zip(value._fields, value)
    elif isinstance(value, (tuple, list)):
        items = ((f"{label}[{i}]", v) for i, v in enumerate(value))
    elif isinstance(value, dict):
        items = ((f"{label}[{k!r}]", v) for k, v in value.items())
    else:
        return []
    return [found for sub, v in items for found in arrays_in(v, sub)]


def same(a, b):
    return a.shape == b.shape and np.array_equal(a, b, equal_nan=a.dtype.kind in "fc")


# The most seconds a backward may run in the check: on its arrays of a few hundred numbers each
# takes milliseconds, so longer is an endless loop.
BACKWARD_SECONDS = 10


class Expired(BaseException):
    """time_limit's end of a body: no Exception, so that a body's own except Exception cannot
    catch it and loop on."""


@contextlib.contextmanager
def time_limit(what):
    """The body, stopped by a TimeoutError that names what after BACKWARD_SECONDS: a learner's
    endless loop is a row that says so, not a check that never ends. No limit while a debugger
    traces the body (a learner's breakpoint()), inside one already running, off the main thread, or
    where there is no SIGALRM (Windows)."""
    if (not hasattr(signal, "setitimer") or threading.current_thread() is not threading.main_thread()
            or signal.getitimer(signal.ITIMER_REAL)[0]):
        yield
        return

    def expired(signum, frame):
        if sys.gettrace() is not None:
            signal.setitimer(signal.ITIMER_REAL, BACKWARD_SECONDS)
            return
        raise Expired

    previous = signal.signal(signal.SIGALRM, expired)
    signal.setitimer(signal.ITIMER_REAL, BACKWARD_SECONDS)
    try:
        yield
    except Expired as e:
        # Where the body was when it stopped: the learner's line, as any error of theirs shows it.
        raise TimeoutError(f"{what} ran for over {BACKWARD_SECONDS} s: an endless "
                           f"loop?").with_traceback(e.__traceback__) from None
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


def watched(backward, changed, named=(), returned_arrays=None):
    """backward, wrapped: each call that changes its dout or what its forward saved, in place, adds
    to changed a line that says so. named: (name, array), to call a saved array by its name.
    returned_arrays: a list, to which each call adds the arrays it returned."""

    def watching(dout, saved):
        before = [(label, array, array.copy()) for label, array in
                  arrays_in(dout, "dout") + arrays_in(saved, "saved")]
        with time_limit(getattr(backward, "__name__", "the backward")):
            returned = backward(dout, saved)
        if returned_arrays is not None:
            returned_arrays.extend(array for _, array in arrays_in(returned, "returned"))
        for label, array, kept in before:
            if not same(array, kept):
                if label != "dout":
                    label = next((n for n, value in named if same(kept, value)), label)
                what = "dout" if label == "dout" else f"{label}, which its forward saved,"
                line = f"{getattr(backward, '__name__', 'the backward')} changed {what} in place"
                if line not in changed:
                    changed.append(line)
        return returned

    return watching


def not_a_gradient(label, grad):
    """Why grad, called label, cannot be compared as a gradient: it is not a NumPy array (a list,
    a torch tensor, a masked array) or holds no real floats (complex, int, str); None where it
    can be."""
    if grad is None:
        return f"{label} is None"
    if not (type(grad) is np.ndarray or isinstance(grad, np.generic)):
        return f"{label} is a {type(grad).__name__}, not a plain NumPy array"
    if grad.dtype.kind != "f":
        return f"{label} holds {grad.dtype} values, not real floats"
    return None


def layer_rows(found, given, tolerance, scale, inputs=()):
    """The Rows of layer_gradients' found pairs: each gradient against its finite differences;
    where one is missing, of another shape or the backward gave a parameter not there, a row
    that says so, and the others still compared."""
    numerics = {name: numeric for name, _, numeric in found}
    rows = []
    for name, grad, numeric in found:
        if grad is None and name not in given and name not in inputs:
            got = ", ".join(given) or "nothing"
            rows.append(Row(name, raised=f"no gradient for {name}; the backward gave {got}"))
            continue
        if said := not_a_gradient(f"d{name}", grad):
            rows.append(Row(name, raised=said))
            continue
        if np.shape(grad) != numeric.shape:
            # A gradient of another shape could broadcast against the reference, unnoticed.
            swapped = [other for other, value in numerics.items() if other != name
                       and np.shape(grad) == value.shape
                       and gpt_numpy.rel_error(grad, value) <= max(tolerance, 1e-4)]
            said = f"; it is d{swapped[0]}'s: the two are swapped" if swapped else ""
            rows.append(Row(name, raised=f"d{name} has the shape {np.shape(grad)}, not {name}'s "
                                         f"{numeric.shape}{said}"))
            continue
        row = compared(name, grad, numeric, tolerance, max(np.abs(grad).max(initial=0),
                                                            np.abs(numeric).max(), scale))
        if row.verdict == "WRONG":
            # Never another gradient within the tolerance of zero: rounding noise matches noise.
            swapped = [other for other, value in numerics.items() if other != name
                       and value.shape == numeric.shape
                       and np.abs(value).max(initial=0) > tolerance * scale
                       and gpt_numpy.rel_error(grad, value) <= max(tolerance, 1e-4)]
            if swapped:
                row.detail = f"its values are d{swapped[0]}'s: the two are swapped"
        rows.append(row)
    return rows


# A broken backward's NaN or overflow makes a WRONG row, and no warning beside it.
@np.errstate(all="ignore")
def check_layer(forward, backward, x, seed=0, tolerance=1e-6, twin=gpt_numpy, **params):
    """[Row for x, then for each parameter]: gpt_numpy.layer_gradients in float64, each row ok or
    WRONG with its largest relative error and the tolerance, or saying the backward changed its
    dout or saved values in place; if forward or backward raises, each row ERROR, saying where in
    twin's file (a learner's copy) it did. A layer of several inputs gets them as a dict,
    {"gate": g, "up": u}, in its forward's order."""
    inputs = x if isinstance(x, dict) else {"x": x}
    changed = []
    given = []
    # The arrays the backward returned: their precision sets the tolerance in force.
    returned_arrays = []
    named = [*inputs.items(), *params.items()]
    watching = watched(backward, changed, named)

    def keeping_keys(dout, saved):
        returned = watching(dout, saved)
        returned_arrays.extend(array for _, array in arrays_in(returned, "returned"))
        if isinstance(returned, tuple) and len(returned) == 2 and isinstance(returned[1], dict):
            given.extend(str(key) for key in returned[1])
        return returned

    try:
        # gpt_numpy's own check, never the learner's copy of it: a row points at the learner's code.
        found = gpt_numpy.layer_gradients(forward, keeping_keys, inputs, params, seed)
    except (Exception, SystemExit) as e:
        raised = raised_here(e, twin, learners_function(twin))
        # Integers, the embedding's indices, have no gradient and no row.
        names = [name for name, value in inputs.items() if np.asarray(value).dtype.kind == "f"]
        return [Row(name, raised=raised) for name in names + list(params)]
    # A gradient that is zero in exact arithmetic holds rounding noise alone, in float32 far more
    # than in float64: each is judged against the largest gradient of the layer, not its own.
    scale = max((np.abs(numeric).max(initial=0) for _, _, numeric in found), default=0) / 10
    rows = layer_rows(found, given, tolerance_for(tolerance, returned_arrays), scale, inputs)
    for key in given:
        if key not in params:
            rows.append(Row(key, raised=f"a gradient for {key}, which the layer does not have "
                                        f"(its parameters: {', '.join(params) or 'none'})"))
    for row in rows:
        if changed and row.raised is None:
            row.problem = (f"{changed[0]} (a caller may read it again, as the residual stream's does: "
                           f"compute into a new array)")
    return rows


GPT2 = dict(norm="layernorm", pos="learned", mlp="gelu", bias=True, tie_weights=True, bigram=0)
# A bigram table of fewer rows than the (V + 1) x V pairs: rows shared, each read more than once.
LLAMA = dict(norm="rmsnorm", pos="rope", mlp="swiglu", bias=False, tie_weights=False, bigram=10)
# The check's models: a batch of B sequences of T tokens, width C, nh heads, a vocabulary of V.
B, T, C, NH, V = 2, 5, 8, 2, 7
# The gradients are checked on MB sequences of T tokens, the models' one fewer than their
# block_size: a backward that takes the sequence's length for the block's, or mixes the batch with
# the heads (MB is not NH), is wrong there.
MB = 3


def model_config(twin, switches, block_size=T):
    return twin.GPTConfig(vocab_size=V, block_size=block_size, n_layer=2, n_head=NH, n_embd=C,
                          **switches)


def from_the_loss(names):
    """Parameter names in the order the backward reaches their layers, from the loss: lm_head
    first, the embeddings last (the reverse of the forward's order, a layer's weight before its
    bias)."""
    layers = list(dict.fromkeys(name.rsplit(".", 1)[0] for name in names))
    return [name for layer in reversed(layers) for name in names if name.rsplit(".", 1)[0] == layer]


def directional(loss, w, direction, h=1e-6):
    """Central differences along a direction: (loss() at w + h d, less at w - h d) / 2h, the
    sum over its entries of the gradient times d. w is changed in place, and restored."""
    kept = w.copy()
    w += h * direction
    up = loss()
    w[...] = kept - h * direction
    down = loss()
    w[...] = kept
    return (up - down) / (2 * h)


def slices_of(w):
    """The parts of w each checked along a direction of their own: each row of a matrix, or a
    vector whole."""
    return [np.s_[i] for i in range(w.shape[0])] if w.ndim >= 2 else [np.s_[:]]


def watching_backwards(twin, changed, returned_arrays=None):
    """Wraps every *_backward of twin in watched, in place, for the model's backward; returns
    what puts them back."""
    names = [name for name in dir(twin) if name.endswith("_backward")
             and callable(getattr(twin, name))]
    kept = {name: getattr(twin, name) for name in names}
    for name in names:
        setattr(twin, name, watched(kept[name], changed, returned_arrays=returned_arrays))
    return lambda: [setattr(twin, name, function) for name, function in kept.items()]


@np.errstate(all="ignore")
def check_model(block, switches, rng, tolerance=1e-6, twin=gpt_numpy):
    """Rows for every tensor of a 2-layer GPT of that block, from the loss back to the embeddings:
    every row of a matrix and every vector checked against finite differences along a random
    direction of its own, d, whose entries are all 0.5 to 1.5 in size (so no entry escapes it):
    the sum of the gradient times d against the change of the loss along d. Each is measured
    against the scale of its tensor, or a tenth of its layer's largest where that is more. A
    gradient missing, misspelt or of another shape is a row that says so. If the forward or
    backward raises, every tensor's row is ERROR, saying where."""
    config = model_config(twin, switches, block_size=T + 1)
    targets = rng.integers(0, V, (MB, T))
    idx = rng.integers(0, V, (MB, T))
    # Gains and biases away from 1 and 0, where they would hide errors.
    params = {name: w + 0.3 * rng.standard_normal(w.shape)
              for name, w in twin.init_params(config, seed=1, dtype=np.float64).items()}
    directions = {name: rng.choice([-1.0, 1.0], w.shape) * rng.uniform(0.5, 1.5, w.shape)
                  for name, w in params.items()}
    order = from_the_loss(list(params))
    function = learners_function(twin)

    def fresh(extra=None):
        # Copies for each model: a layer that writes into the weights, the indices or the targets
        # in place cannot move what the finite differences measure.
        return twin.GPT(config, {name: w.copy() for name, w in {**params, **(extra or {})}.items()})

    changed = []
    # What each layer's backward returned: a model's gradients computed through a float32 layer
    # are judged to float32's tolerance, though GPT.backward adds them into float64 arrays.
    returned_arrays = []
    restore = watching_backwards(twin, changed, returned_arrays)
    # A misspelt key a backward added into (grads["wte.wieght"] += ...): the tensor it meant. The
    # backward runs again with that key among the weights, so that a dict of gradients made from
    # them holds it, and every other tensor is still checked.
    meant = {}
    try:
        while True:
            model = fresh({key: np.zeros_like(params[name]) for key, name in meant.items()})
            model.forward(idx.copy(), targets.copy())
            try:
                with time_limit("GPT.backward"):
                    grads = model.backward()
                break
            except KeyError as e:
                key = e.args[0] if len(e.args) == 1 else None
                near = difflib.get_close_matches(key, list(params), 1, 0.8) if isinstance(
                    key, str) and key not in params and key not in meant else []
                if not near:
                    raise
                meant[key] = near[0]
        if not isinstance(grads, dict):
            raise TypeError(f"GPT.backward returned {type(grads).__name__}, not a dict of "
                            f"gradients by name")
    except (Exception, SystemExit) as e:
        raised = raised_here(e, twin, function)
        return [Row(f"model ({block}): {name}", raised=raised) for name in order]
    finally:
        restore()
    rows = key_rows(block, params, grads, meant)
    order = [name for name in order if name not in rows]
    tolerance = tolerance_for(tolerance, returned_arrays + list(grads.values()))

    def loss():
        return fresh().forward(idx.copy(), targets.copy())[1]

    def along(name, direction_of):
        """Ours and the differences' for each slice of name, along direction_of's directions."""
        d = directions[direction_of]
        g = np.asarray(grads[name], dtype=np.float64)
        return np.array([np.sum(g[s] * d[s]) for s in slices_of(d)])

    numeric = {}
    for name in order:
        try:
            w = params[name]
            numeric[name] = np.array([directional(loss, w[s], directions[name][s])
                                      for s in slices_of(w)])
        except (Exception, SystemExit) as e:
            rows[name] = Row(f"model ({block}): {name}", raised=raised_here(e, twin, function))
    layer_scale = {}
    for name, n in numeric.items():
        layer = name.rsplit(".", 1)[0]
        layer_scale[layer] = max(layer_scale.get(layer, 0), np.abs(n).max())
    ours = {name: along(name, name) for name in numeric}
    # The scale of a slice is the sum of its entries' sizes, |gradient| |d|, whatever cancels in
    # their sum. A gradient that is zero in exact arithmetic (the keys' bias of GPT-2's block:
    # softmax ignores a shift its whole row shares) holds rounding noise alone, with no scale of
    # its own: it is measured against its layer's.
    sizes = {name: np.array([np.sum(np.abs(np.asarray(grads[name], dtype=np.float64)[s]
                                           * directions[name][s])) for s in slices_of(params[name])])
             for name in numeric}
    scales = {name: max(sizes[name].max(), np.abs(n).max(),
                        layer_scale[name.rsplit(".", 1)[0]] / 10) for name, n in numeric.items()}
    for name, n in numeric.items():
        row = Row(f"model ({block}): {name}", gpt_numpy.rel_error(ours[name], n, scales[name]),
                  tolerance)
        if row.verdict == "WRONG":
            row.detail = model_detail(name, ours[name], n, params, grads, numeric, scales, along,
                                      tolerance, loss)
            row.problem = changed[0] if changed else None
        rows[name] = row
    return [rows[name] for name in from_the_loss(list(params)) if name in rows] + [
        row for name, row in rows.items() if name not in params]


def key_rows(block, params, grads, meant):
    """{name: Row} for each tensor whose gradient GPT.backward did not give under its name, or gave
    in another shape, and for each key it gave that names no tensor; the rest are checked."""
    given = [key for key in grads if key not in params]
    # Each key that names no tensor, by the tensor it is nearest to: the one it meant.
    for key in given:
        near = difflib.get_close_matches(key, list(params), 1, 0.8) if isinstance(key, str) else []
        if near and key not in meant:
            meant[key] = near[0]
    rows = {}
    for name in from_the_loss(list(params)):
        typo = [key for key, tensor in meant.items() if tensor == name]
        if name not in grads or typo:
            got = f"got {typo[0]}" if typo else f"GPT.backward gave no key {name}"
            rows[name] = Row(f"model ({block}): {name}", raised=f"no gradient for {name}; {got}")
        elif said := not_a_gradient(f"the gradient of {name}", grads[name]):
            rows[name] = Row(f"model ({block}): {name}", raised=said)
        elif np.shape(grads[name]) != params[name].shape:
            rows[name] = Row(f"model ({block}): {name}", raised=f"the gradient of {name} has the "
                             f"shape {np.shape(grads[name])}, not {params[name].shape}")
    for key in given:
        if key not in meant:
            rows[key] = Row(f"model ({block}): {key}", raised=f"a gradient for {key}, which the "
                                                              f"model does not have")
    return rows


def model_detail(name, ours, n, params, grads, numeric, scales, along, tolerance, loss):
    """How a model tensor's gradient is wrong: the factor, or the tensor whose gradient its
    values are (two swapped), or the rows that differ and the entry that differs most in the
    worst of them."""
    if not (np.isfinite(ours).all() and np.isfinite(n).all()):
        return how_wrong(ours, n)
    if not np.abs(ours).max() > 0:
        return "it is all zeros"
    for other in numeric:
        # A gradient within the tolerance of zero (the keys' bias of GPT-2's block) is rounding
        # noise, which any other noise matches: it is no sign of a swap.
        if other != name and params[other].shape == params[name].shape and (
                np.abs(numeric[other]).max() > tolerance * scales[other]):
            if gpt_numpy.rel_error(along(name, other), numeric[other], scales[other]) <= tolerance:
                return f"its values are {other}'s gradient: the two are swapped"
    w = params[name]
    mine = np.asarray(grads[name], dtype=np.float64)
    if w.ndim < 2:
        # A vector was checked along one direction: its entries one by one say how it differs.
        right = gpt_numpy.numerical_gradient(loss, w, list(np.ndindex(w.shape)))
        return how_wrong(mine, right.reshape(w.shape), scale=scales[name])
    said = factor_of(ours, n)
    if said is not None:
        return said
    differ = np.flatnonzero(np.abs(ours - n) > tolerance * scales[name])
    worst = int(np.argmax(np.abs(ours - n)))
    right = gpt_numpy.numerical_gradient(loss, w[worst], list(np.ndindex(w[worst].shape)))
    i = int(np.argmax(np.abs(mine[worst].ravel() - right)))
    at = ", ".join(str(int(j)) for j in (worst, *np.unravel_index(i, w[worst].shape)))
    rows = ", ".join(str(int(r)) for r in differ[:6]) + (", ..." if len(differ) > 6 else "")
    return (f"rows {rows} of {len(ours)} differ, the most at [{at}]: ours "
            f"{mine[worst].ravel()[i]:.6g} vs finite differences {right[i]:.6g}")


# The names of a layer backward's inputs, where it has more than one: its dx is a tuple of theirs.
INPUTS = {"attention_backward": ("q", "k", "v"), "swiglu_backward": ("gate", "up")}


def own_precision(value):
    """value as an array of floats, in its own precision where it is one (float32's sets the
    tolerance it is compared to), else in float64."""
    value = np.asarray(value)
    return value if value.dtype.kind == "f" else value.astype(np.float64)


def recorded(twin, config, params, idx, targets):
    """[(layer, what, array)] in the order GPT.backward of twin reaches them: each layer's dout,
    the gradient at its output, then the gradient at each of its inputs its backward returns.
    The layers are named as backward(activations=True) keys them."""
    calls = []
    names = [name for name in dir(twin) if name.endswith("_backward")]
    kept = {name: getattr(twin, name) for name in names}

    depth = [0]

    def recording(name):
        def backward(dout, saved):
            # Only GPT.backward's own calls: not softmax_backward inside attention_backward.
            depth[0] += 1
            try:
                returned = kept[name](dout, saved)
            finally:
                depth[0] -= 1
            if depth[0] == 0:
                calls.append((name, dout, returned))
            return returned
        return backward

    for name in names:
        setattr(twin, name, recording(name))
    try:
        model = twin.GPT(config, {n: w.copy() for n, w in params.items()})
        model.forward(idx.copy(), targets.copy())
        returned = model.backward(activations=True)
        if not (isinstance(returned, tuple) and len(returned) == 2 and isinstance(returned[1], dict)):
            raise TypeError(f"what it returned is a {type(returned).__name__}, not the pair (grads, "
                            f"douts) that activations=True asks for")
        douts = returned[1]
    finally:
        for name, function in kept.items():
            setattr(twin, name, function)
    # back() keys each dout as it hands it to the layer's backward: each call is named by the key
    # of the dout it was given, in order (two layers may be handed one array), else by its function.
    layers = [name for name, _, _ in calls]
    at = 0
    for key, value in douts.items():
        given = [n for n in range(at, len(calls)) if calls[n][1] is value]
        if given:
            layers[given[0]] = key
            at = given[0] + 1
    found = []
    for layer, (name, dout, returned) in zip(layers, calls):
        found.append((layer, "dout", own_precision(dout)))
        dx = returned[0] if isinstance(returned, tuple) and len(returned) == 2 else None
        dxs = dx if isinstance(dx, tuple) else (dx,)
        for label, value in zip(INPUTS.get(name, ("x",)), dxs):
            if value is not None:
                found.append((layer, f"d{label}", own_precision(value)))
    return found


@np.errstate(all="ignore")
def intermediates(block, switches, twin=gpt_numpy, log=print):
    """Logs GPT.backward's intermediates on the check's model of that block, twin's against the
    reference's (gpt_numpy's), as makemore's cmp does line by line: each layer's dout and the
    gradients its backward hands back, from the loss down, each exact, close (to 1e-6 of its
    size; float32's tolerance for one in float32) or DIFFERS, with the largest difference; then
    the first that differs. Returns it, or None where none does."""
    rng = np.random.default_rng(0)
    config = model_config(gpt_numpy, switches, block_size=T + 1)
    params = {name: w + 0.3 * rng.standard_normal(w.shape)
              for name, w in gpt_numpy.init_params(config, seed=1, dtype=np.float64).items()}
    idx, targets = rng.integers(0, V, (MB, T)), rng.integers(0, V, (MB, T))
    reference = recorded(gpt_numpy, config, params, idx, targets)
    try:
        yours = recorded(twin, model_config(twin, switches, block_size=T + 1), params, idx, targets)
    except (Exception, SystemExit) as e:
        log(f"intermediates ({block}): GPT.backward(activations=True) raised "
            f"{raised_here(e, twin, learners_function(twin))}")
        return f"GPT.backward ({block})"
    log(f"intermediates ({block}), yours against the reference's, from the loss down:")
    # By name: a backward may call its layers in another order and be right.
    yours = {(layer, what): array for layer, what, array in yours}
    first = None
    for layer, what, ref in reference:
        name = f"{layer}: {what}"
        if (layer, what) not in yours or yours[layer, what].shape != ref.shape:
            said = (f"yours is {yours[layer, what].shape}" if (layer, what) in yours else
                    "yours has none (douts keyed by layer, as the forward keys what it saves)")
            log(f"  {name:36s} DIFFERS  {ref.shape}, {said}")
            first = first or name
            continue
        mine = yours[layer, what].astype(np.float64)
        diff = float(np.abs(mine - ref).max()) if ref.size else 0.0
        close = tolerance_for(1e-6, [yours[layer, what]]) * max(np.abs(ref).max(), 1e-300)
        verdict = ("exact" if np.array_equal(mine, ref) else
                   "close" if diff <= close else "DIFFERS")
        log(f"  {name:36s} {verdict:7s}  max diff {diff:.1e}")
        if verdict == "DIFFERS":
            first = first or name
    log(f"first to differ: {first}" if first else "every intermediate exact or close")
    return first


def fixed_weights(config, dtype=np.float64):
    """Weights from a formula, the same on every machine and no random generator's: each tensor's
    entries 0.5 sin(0.7 k + n + 1) for its k-th entry and its n-th name in sorted order, gains
    and biases included (off 1 and 0); shaped and named as gpt_numpy.init_params makes them."""
    shapes = {name: w.shape for name, w in gpt_numpy.init_params(config).items()}
    return {name: (0.5 * np.sin(0.7 * np.arange(math.prod(shape)) + n + 1)).reshape(shape)
            .astype(dtype) for n, (name, shape) in enumerate(sorted(shapes.items()))}


def fixed_ids():
    """The ids the known logits are for, (B, T), a token repeated among them."""
    return (3 * np.arange(B * T) + 1).reshape(B, T) % V


@np.errstate(all="ignore")
def check_forward(block, switches, tolerance=1e-6, twin=gpt_numpy):
    """Two rows that hold the forward itself, which finite differences of it cannot: causality
    (the logits at a position do not move when a later token changes) and the logits gpt.py gives
    for fixed weights (fixtures/twin_logits.json)."""
    config = model_config(twin, switches)
    params = fixed_weights(config)
    ids = fixed_ids()
    name = f"forward ({block}): "
    try:
        logits = twin.GPT(config, {n: w.copy() for n, w in params.items()}).forward(ids.copy())[0]
    except (Exception, SystemExit) as e:
        raised = raised_here(e, twin, learners_function(twin))
        return [Row(name + "causality", raised=raised), Row(name + "known logits", raised=raised)]
    rows = []
    try:
        moved = 0.0
        for t in range(T - 1):
            later = ids.copy()
            later[:, t + 1:] = (later[:, t + 1:] + 1) % V
            changed = twin.GPT(config, {n: w.copy() for n, w in params.items()}).forward(later)[0]
            moved = max(moved, float(np.abs(changed[:, :t + 1] - logits[:, :t + 1]).max()))
        error = moved / np.abs(logits).max() if np.isfinite(moved) else math.inf
        detail = "a logit moved when a later token changed: a position sees ahead"
        rows.append(Row(name + "causality", error, tolerance, detail=detail))
    except (Exception, SystemExit) as e:
        rows.append(Row(name + "causality", raised=raised_here(e, twin)))
    try:
        # A FIFO there would wait for a writer for ever.
        if os.path.exists(KNOWN_LOGITS) and not os.path.isfile(KNOWN_LOGITS):
            raise ValueError("it is not a regular file: put the project's fixtures/twin_logits.json "
                             "in its place")
        with open(KNOWN_LOGITS, encoding="utf-8") as f:
            known = np.array(json.load(f)["logits"][block])
        rows.append(compared(name + "known logits", logits, known, tolerance, versus="gpt.py's"))
    except (OSError, ValueError, KeyError) as e:
        rows.append(Row(name + "known logits", raised=f"cannot read {KNOWN_LOGITS}: {e}"))
    except (Exception, SystemExit) as e:
        rows.append(Row(name + "known logits", raised=raised_here(e, twin)))
    return rows


def ended_with(function, *args):
    """(the exception function raised or None, its local variables as it ended), read as its
    frame returns: the intermediates of a backward, by the names its body gives them."""
    found = {}

    def profile(frame, event, arg):
        if event == "return" and frame.f_code is function.__code__:
            found.update(frame.f_locals)

    kept = sys.getprofile()
    sys.setprofile(profile)
    try:
        with time_limit(function.__name__):
            function(*args)
        raised = None
    except (Exception, SystemExit) as e:
        raised = e
    finally:
        sys.setprofile(kept)
    return raised, found


def stage_rows(name, ex, forward, x, params, tolerance, twin):
    """The rows of a stage exercise: each of the intermediates it names, as the learner's backward
    in twin ends, against the reference's (gpt_numpy's) on the layer's own check inputs."""
    inputs = list(x.values()) if isinstance(x, dict) else [x]
    out, saved = forward(*[np.copy(v) for v in inputs], **params)
    dout = np.random.default_rng(0).standard_normal(np.shape(out))
    function = ex["function"]
    _, reference = ended_with(getattr(gpt_numpy, function), dout.copy(), saved)
    raised, yours = ended_with(getattr(twin, function), dout.copy(), saved)
    rows = []
    for var in ex["lines"]:
        row_name = f"{name}: {var} (intermediate)"
        if var not in yours:
            said = f" (it raised {raised_here(raised, twin, function)})" if raised else ""
            rows.append(Row(row_name, raised=f"{function} ended without a value named {var}{said}"))
        # Only where the reference's is an array of floats: a value of another kind is compared as it is.
        elif (said := not_a_gradient(var, yours[var])) and not not_a_gradient(var, reference[var]):
            rows.append(Row(row_name, raised=said))
        elif np.shape(yours[var]) != np.shape(reference[var]):
            rows.append(Row(row_name, raised=f"{var} has the shape {np.shape(yours[var])}, not "
                                             f"{np.shape(reference[var])}"))
        else:
            rows.append(compared(row_name, yours[var], reference[var],
                                 tolerance_for(tolerance, [yours[var]]), versus="the reference's"))
    return rows


# What --check NAME runs: the layer rows named so, then those of the layers that call it, and the
# models whose block uses it. "model" is GPT.backward's: the models alone.
CHECKS = {
    "linear": ([], ("gpt2", "llama")),
    "embedding": ([], ("gpt2", "llama")),
    "crossentropy": ([], ("gpt2", "llama")),
    "gelu": ([], ("gpt2",)),
    "swiglu": ([], ("llama",)),
    "softmax": (["attention", "attention, rope"], ("gpt2", "llama")),
    "layernorm": ([], ("gpt2",)),
    "rmsnorm": ([], ("llama",)),
    "rope": (["attention, rope"], ("llama",)),
    "attention": (["attention, rope"], ("gpt2", "llama")),
    "attention, rope": ([], ("llama",)),
    "model": ([], ("gpt2", "llama")),
}


@np.errstate(all="ignore")
def check(tolerance=1e-6, log=print, twin=gpt_numpy, only=None, models=True):
    """Checks every layer's backward alone, the simplest first, then for a GPT-2 and a Llama block
    the forward (causality, known logits) and every gradient of the model, against finite
    differences in float64. only: a name of CHECKS, for that layer's rows and the models that use
    it; models=False, the layer rows alone. Logs one table, every row to the end whatever breaks;
    returns whether every row is ok."""
    rng = np.random.default_rng(0)

    def randn(*shape):
        return rng.standard_normal(shape)

    config = model_config(twin, {})
    cos, sin = (table[:T] for table in twin.rope_tables(config, np.float64))
    targets = rng.integers(0, V, (MB, T))
    idx = rng.integers(0, V, (MB, T))
    hs = C // NH
    # The pieces before what calls them, so that the summary's first names the piece that is wrong.
    layers = [
        ("linear", twin.linear_forward, twin.linear_backward, randn(MB, T, C),
         dict(weight=randn(3, C), bias=randn(3))),
        ("embedding", twin.embedding_forward, twin.embedding_backward, idx,
         dict(weight=randn(V, C))),
        ("crossentropy", lambda x: twin.crossentropy_forward(x, targets),
         twin.crossentropy_backward, randn(MB, T, V), {}),
        ("gelu", twin.gelu_forward, twin.gelu_backward, randn(MB, T, C), {}),
        ("swiglu", twin.swiglu_forward, twin.swiglu_backward,
         dict(gate=randn(MB, T, C), up=randn(MB, T, C)), {}),
        ("softmax", twin.softmax_forward, twin.softmax_backward, randn(MB, T, T), {}),
        ("layernorm", twin.layernorm_forward, twin.layernorm_backward, randn(MB, T, C),
         dict(weight=randn(C), bias=randn(C))),
        ("rmsnorm", twin.rmsnorm_forward, twin.rmsnorm_backward, randn(MB, T, C),
         dict(weight=randn(C))),
        ("rope", lambda x: twin.rope_forward(x, cos, sin), twin.rope_backward,
         randn(MB, NH, T, hs), {}),
        ("attention", lambda q, k, v: twin.attention_forward(q, k, v, NH),
         twin.attention_backward, dict(q=randn(MB, T, C), k=randn(MB, T, C), v=randn(MB, T, C)), {}),
        ("attention, rope", lambda q, k, v: twin.attention_forward(q, k, v, NH, (cos, sin)),
         twin.attention_backward, dict(q=randn(MB, T, C), k=randn(MB, T, C), v=randn(MB, T, C)), {}),
    ]
    names = [only, *CHECKS[only][0]] if only is not None else [layer[0] for layer in layers]
    blocks = CHECKS[only][1] if only is not None else ("gpt2", "llama")
    blocks = blocks if models else ()
    log(f"{'layer input, or model tensor':44s} {'max rel. error':>14s}")
    rows = []

    def show(new_rows):
        for row in new_rows:
            log(str(row))
        rows.extend(new_rows)

    ex = learners_exercise(twin) or {}
    for name, forward, backward, x, params in layers:
        if name not in names:
            continue
        if ex.get("lines") and name == ex["check"]:
            show(stage_rows(name, ex, forward, x, params, tolerance, twin))
        layer_rows = check_layer(forward, backward, x, tolerance=tolerance, twin=twin, **params)
        for row in layer_rows:
            row.name = f"{name}: d{row.name}"
        show(layer_rows)
    for block, switches in (("gpt2", GPT2), ("llama", LLAMA)):
        if block in blocks:
            show(check_forward(block, switches, tolerance, twin))
            show(check_model(block, switches, rng, tolerance, twin))
    bad = [row for row in rows if row.verdict != "ok"]
    wrong = sum(row.verdict == "WRONG" for row in rows)
    errors = sum(row.verdict == "ERROR" for row in rows)
    first = f": first {bad[0].name}" if bad else ""
    log(f"{len(rows) - len(bad)} ok, {wrong} WRONG, {errors} ERROR{first}")
    return not bad


# --------------------------------------------------------------------------------------- workbook
# The fields of an exercise that breaks a line of a backward, and of one that writes a body.
EXERCISE_FIELDS = {"title": str, "function": str, "change": str, "to": str, "rows": dict,
                   "models": dict, "why": str}
WRITE_FIELDS = {"title": str, "function": str, "check": str, "hints": list}


def exercises():
    """The workbook, workbook.json beside this file: each exercise either names a function of
    gpt_numpy.py, a line of it to change and how, with its answer (the rows of --check that turn
    WRONG or ERROR, and why); or names a function whose body the learner writes, and the --check
    NAME that grades it. A workbook that is missing, unreadable or not of that shape raises a
    ValueError of one line."""
    path = os.path.join(HERE, "workbook.json")
    fix = "put back the workbook.json that came with gpt_numpy.py"
    try:
        if not os.path.isfile(path):
            raise OSError(0, "it is not a file" if os.path.exists(path) else "it is missing")
        size = os.path.getsize(path)
        if size == 0:
            raise OSError(0, "it is empty")
        # The workbook has a few thousand bytes: a far larger file is not it, and is not read.
        if size > 1_000_000:
            raise OSError(0, f"it has {size:,} bytes, where the workbook has a few thousand")
        with open(path, encoding="utf-8") as f:
            found = json.load(f)
    except OSError as e:
        raise ValueError(f"cannot read the workbook {path} ({e.strerror}): {fix}") from None
    except UnicodeDecodeError:
        raise ValueError(f"cannot read the workbook {path} (it is not UTF-8 text): {fix}") from None
    except json.JSONDecodeError as e:
        raise ValueError(f"the workbook {path} is not valid JSON ({e.msg} at line {e.lineno}, "
                         f"column {e.colno}): {fix}") from None
    except RecursionError:
        raise ValueError(f"the workbook {path} is not the workbook (its lists or objects nest "
                         f"too deep to read): {fix}") from None
    problem = workbook_problem(found)
    if problem is None:
        with open(gpt_numpy.__file__, encoding="utf-8") as f:
            tree = ast.parse(f.read())
        for number, ex in enumerate(found, 1):
            try:
                node = function_node(tree, ex["function"])
                for name in ex.get("with", []):
                    function_node(tree, name)
                for name in ex.get("lines", []):
                    if first_set(node, name) is None:
                        raise ValueError(f"{ex['function']} has no line that sets {name}")
            except ValueError as e:
                problem = f'exercise {number}\'s "function": {e}'
                break
    if problem is not None:
        raise ValueError(f"the workbook {path} is broken ({problem}): {fix}")
    return found


def workbook_problem(found):
    """What is wrong with the shape of a workbook as JSON reads it, in a few words; None if
    nothing."""
    # Python's types by JSON's names for them.
    kinds = {dict: "an object", list: "a list", str: "text", int: "a number", float: "a number",
             bool: "true or false", type(None): "null"}
    if not isinstance(found, list):
        return f"it holds {kinds[type(found)]}, not a list of exercises"
    if not found:
        return "it holds no exercises"
    for number, ex in enumerate(found, 1):
        if not isinstance(ex, dict):
            return f"exercise {number} is {kinds[type(ex)]}, not an object of fields"
        fields = WRITE_FIELDS if "check" in ex else EXERCISE_FIELDS
        for field, kind in fields.items():
            if field not in ex:
                return f'exercise {number} has no "{field}"'
            if not isinstance(ex[field], kind):
                held = kinds[type(ex[field])]
                return f'exercise {number}\'s "{field}" is {held}, not {kinds[kind]}'
        if "check" in ex and ex["check"] not in CHECKS:
            return f'exercise {number}\'s "check" is {ex["check"]!r}, not a name --check takes'
        if "check" in ex and not (len(ex["hints"]) >= 3
                                  and all(isinstance(h, str) and h for h in ex["hints"])):
            return f'exercise {number}\'s "hints" is not a list of 3 or more texts'
        if not (isinstance(ex.get("lines", []), list) and all(
                isinstance(name, str) for name in ex.get("lines", []))) or "lines" in ex and (
                "check" not in ex or not ex["lines"]):
            return f'exercise {number}\'s "lines" is not a write exercise\'s list of names'
        if not (isinstance(ex.get("with", []), list)
                and all(isinstance(name, str) for name in ex.get("with", []))):
            return f'exercise {number}\'s "with" is not a list of functions'
        for field in ("rows", "models") if "check" not in ex else ():
            for name, verdict in ex[field].items():
                if verdict not in ("WRONG", "ERROR"):
                    return (f'exercise {number}\'s "{field}" gives {name} the verdict '
                            f'{verdict!r}, not "WRONG" or "ERROR"')
        turned = ex.get("tensors", {})
        if not isinstance(turned, dict) or not all(isinstance(t, str) for t in turned.values()):
            return f'exercise {number}\'s "tensors" is not an object of texts'
        if not isinstance(ex.get("tensors_why", ""), str):
            return f'exercise {number}\'s "tensors_why" is not text'
    return None


def function_node(tree, function):
    """The ast node of function ("softmax_backward" or "GPT.backward") in a module's tree; a
    ValueError if it has none."""
    node = tree
    for part in function.split("."):
        node = next((n for n in getattr(node, "body", []) if getattr(n, "name", None) == part),
                    None)
        if node is None:
            raise ValueError(f"gpt_numpy.py has no function {function}")
    return node


def first_set(node, name):
    """The statement of node's body that first assigns name, or None: a stage's line."""
    return next((n for n in node.body if isinstance(n, ast.Assign)
                 and name in [t.id for t in n.targets if isinstance(t, ast.Name)]), None)


def above(lines, node):
    """The index of the first line of the comments right above node's def: its derivation."""
    start = node.lineno - 1
    while start > 0 and lines[start - 1].strip().startswith("#"):
        start -= 1
    return start


def blanked(source, function, also=(), note=None, names=()):
    """(source with function's body gone, the body). The body becomes a raise that says it is the
    learner's to write; the docstring stays, as the contract. The comments above each blanked
    function, its derivation, which ends in the body's formula, go too: note, when given, takes
    their place ({name} in it, the function's). also: functions blanked the same way, whose
    finished bodies would give the method away (RMSNorm's beside LayerNorm's)."""
    body = None
    for name in (function, *also):
        node = function_node(ast.parse(source), name)
        lines = source.splitlines(keepends=True)
        has_docstring = ast.get_docstring(node) is not None
        first = node.body[1 if has_docstring else 0]
        start = first.lineno - 1
        # The comments at the top of the body are the body's.
        while start > node.lineno and lines[start - 1].strip().startswith("#"):
            start -= 1
        hole = (f'{" " * first.col_offset}raise NotImplementedError("{name}: its body is yours to '
                f'write")\n')
        end = node.end_lineno
        if names and name == function:
            # Only the statements that first set each of names: the lines of one stage.
            sets = [first_set(node, name_) for name_ in names]
            start, end = min(n.lineno for n in sets) - 1, max(n.end_lineno for n in sets)
            hole = (f'{" " * first.col_offset}raise NotImplementedError("{name}: '
                    f'{" and ".join(names)} are yours to write")\n')
        indent = " " * node.col_offset
        said = [f"{indent}# {line}\n" for line in
                textwrap.wrap(note.format(name=name), 98 - len(indent))] if note else []
        if name == function:
            body = "".join(lines[start:end])
        top = node.lineno - 1
        source = "".join(lines[:above(lines, node)] + said + lines[top:start] + [hole]
                         + lines[end:])
    return source, body


def derivation(source, function):
    """The comments right above function in source: the derivation its body follows."""
    node = function_node(ast.parse(source), function)
    lines = source.splitlines(keepends=True)
    return "".join(lines[above(lines, node):node.lineno - 1])


def blanked_too(ex):
    """The functions an exercise blanks beside its own, each a write exercise's function."""
    return list(ex.get("with", []))


def check_of(function):
    """The --check NAME that grades function, from the workbook's write exercises."""
    return next(ex["check"] for ex in exercises() if ex["function"] == function and "check" in ex)


def hints_of(number):
    """Exercise number's hints, first the gradients' shapes, then the rule, then a sketch; a
    ValueError of one line for an exercise that breaks a line, which has none."""
    ex = exercises()[number - 1]
    if "check" not in ex:
        raise ValueError(f"exercise {number} breaks a line and asks what turns: it has no hints, "
                         f"only its answer (--exercise {number} --answer)")
    return ex["hints"]


def hint_text(number, upto, lesson="python gpt_numpy.py"):
    """Hints 1 to upto of exercise number, the last one new, and what comes next."""
    hints = hints_of(number)
    shown_hints = "\n".join(textwrap.fill(f"{i}. {hint}", 96, subsequent_indent="   ")
                             for i, hint in enumerate(hints[:upto], 1))
    after = (f"The next: {lesson} --exercise {number} --hint" if upto < len(hints) else
             f"No more hints: the derivation and the body are {lesson} --exercise {number} --answer")
    return f"Exercise {number}, hint {upto} of {len(hints)}:\n{shown_hints}\n{after}"


def next_hint(number, twin=gpt_numpy, upto=None):
    """The text of exercise number's hints with one more than the last time (or, with upto, up to
    that one), the count kept in exercise_N.hint beside the learner's copy (or where it would be
    made)."""
    hints = hints_of(number)
    folders = list(dict.fromkeys([os.path.dirname(os.path.abspath(gpt_numpy.__file__)),
                                  os.path.dirname(os.path.abspath(twin.__file__)), os.getcwd()]))
    folder = next((f for f in folders if os.path.lexists(os.path.join(f, copy_name(number)))),
                  next((f for f in folders if writable(f)), folders[0]))
    path = os.path.join(folder, f"exercise_{number}.hint")
    # A folder or a FIFO there (reading one waits for a writer for ever) keeps no count.
    if os.path.lexists(path) and not os.path.isfile(path):
        raise ValueError(f"{shown(path)} is there and is not a file: move it away, then ask "
                         f"again")
    if upto is None:
        try:
            with open(path, encoding="utf-8") as f:
                given = int(f.read().strip() or 0)
        except (OSError, ValueError):
            given = 0
        upto = min(max(given, 0) + 1, len(hints))
    if not 1 <= upto <= len(hints):
        raise ValueError(f"exercise {number} has hints 1 to {len(hints)}, not {upto}")
    try:
        with open(path, "w", encoding="utf-8") as f:
            f.write(f"{upto}\n")
    except OSError as e:
        raise ValueError(f"cannot keep the count of hints in {path} ({e.strerror}): ask for one "
                         f"by its number, --hint K") from None
    return hint_text(number, upto, f"python {shown(gpt_numpy.__file__)}")


def listing():
    """--exercise list: each exercise's number, kind and function, and nothing of any answer (a
    break exercise's title names its slip, the line of the reference it changes)."""
    found = exercises()
    lines = []
    for number, ex in enumerate(found, 1):
        functions = [ex["function"], *blanked_too(ex)]
        kind = ("break a line of" if "check" not in ex else
                f"write {' and '.join(ex['lines'])} in" if ex.get("lines") else
                "write the body of" if len(functions) == 1 else "write the bodies of")
        functions = " and ".join(functions)
        lines.append(f"{number:2d}. {kind} {functions}")
    writes = [n for n, ex in enumerate(found, 1) if "check" in ex]
    lines.append(textwrap.fill(f"Each break exercise shows a line of its function's body: write that "
                               f"body first ({writes[0]} to {writes[-1]}) to find it yourself. "
                               f"--exercise N starts one; --exercise N --hint gives a write "
                               f"exercise's hints, one more each time.", 96))
    return "\n".join(lines)


def copy_name(number):
    return f"exercise_{number}.py"


def exercise_text(number, answer=False, path=None):
    """Exercise number (from 1) as a learner reads it: what to do and the question; or, with
    answer, which rows turn and why, or the body to write. path: where the learner's copy is."""
    found = exercises()
    if not 1 <= number <= len(found):
        raise ValueError(f"there are exercises 1 to {len(found)}")
    ex = found[number - 1]
    lesson = f"python {shown(gpt_numpy.__file__)}"
    functions = [ex["function"], *blanked_too(ex)]
    if "check" in ex and not answer:
        path = path or copy_name(number)
        both = ""
        if len(functions) > 1:
            both = (f" So is the body of {' and '.join(functions[1:])}, whose finished body would "
                    f"give the method away: write both.")
        gone = (f"the lines of {ex['function']} that set {' and '.join(ex['lines'])} are gone "
                f"(the check compares them, by those names, with the reference's)"
                if ex.get("lines") else f"the body of {ex['function']} is gone")
        steps = (f"{lesson} --exercise {number} made {shown(path)}, a copy of gpt_numpy.py in which "
                 f"{gone}, and the derivation above it.{both} "
                 f"Write the body from the rules and the forward, then grade it (again as often as "
                 f"you like):")
        commands = "\n".join(f"    {grading_command(path, check_of(function))}"
                             for function in functions)
        return (f"Exercise {number} of {len(found)}: {ex['title']}\n\n{textwrap.fill(steps, 96)}\n"
                f"{commands}\nEvery row ok: it is right. "
                f"A WRONG row says how far off, an ERROR row the line where it raised.\n"
                f"Stuck: {lesson} --exercise {number} --hint, one hint more each time "
                f"(the shapes, the rule, a sketch).\n"
                f"The answer: {lesson} --exercise {number} --answer")
    if "check" in ex:
        with open(gpt_numpy.__file__, encoding="utf-8") as f:
            source = f.read()
        said = []
        for function in functions:
            body = blanked(source, function)[1]
            worked = textwrap.indent(textwrap.dedent(derivation(source, function)), "    ")
            body = textwrap.indent(textwrap.dedent(body), "    ")
            said.append(f"The derivation and the body of {function}:\n{worked}{body}".rstrip())
        return f"Exercise {number}: {ex['title']}\n" + "\n".join(said)
    if not answer:
        question = ("Predict, before you run it: which layer rows of python gpt_numpy.py --check "
                    "turn WRONG (or ERROR), which of the two models, gpt2 and llama, get rows "
                    "that do, and which of their tensors? Then run the check on your copy: python "
                    "mine.py --check.")
        return (f"Exercise {number} of {len(found)}: {ex['title']}\n\n"
                f"In your copy of gpt_numpy.py (cp gpt_numpy.py mine.py), in {ex['function']}, "
                f"change the line\n"
                f"    {ex['change']}\nto\n    {ex['to']}\n\n{textwrap.fill(question, 96)}\n"
                f"The answer: {lesson} --exercise {number} --answer")
    rows = ", ".join(f"{name} ({verdict})" for name, verdict in ex["rows"].items()) or "none"
    models = ", ".join(f"{name} ({verdict})" for name, verdict in ex["models"].items()) or "neither"
    why = textwrap.fill(f"Why: {ex['why']}.", 96)
    tensors = "; ".join(f"{name}: {said}" for name, said in ex.get("tensors", {}).items())
    if tensors:
        tensors = textwrap.fill(f"Model tensors that turn ({'*'} for any block or part of a "
                                f"name): {tensors}. Why: {ex.get('tensors_why', '')}.", 96)
        why += "\n" + tensors
    return (f"Exercise {number}: {ex['title']}\nLayer rows that turn: {rows}.\n"
            f"Models with rows that turn: {models}.\n{why}")


def exercise_source(source, number):
    """The learner's copy of source (gpt_numpy.py) for write exercise number: its functions' bodies
    and derivations gone, a note where each derivation was."""
    ex = exercises()[number - 1]
    yours = (f"the code that sets {' and '.join(ex['lines'])} is yours" if ex.get("lines") else
             "its body is yours")
    note = (f"{{name}}: {yours} to write, from the rules and the forward. Hints, one more "
            f"each time: python gpt_numpy.py --exercise {number} --hint; its derivation and its "
            f"body: --exercise {number} --answer")
    return blanked(source, ex["function"], blanked_too(ex), note, ex.get("lines", ()))[0]


def writable(folder):
    return os.access(folder, os.W_OK)


def start_exercise(number, twin=gpt_numpy):
    """Makes the learner's copy of twin (gpt_numpy) for a write exercise beside it, or, where that
    folder is read-only, in the current one, unless a copy is in either already (the learner's
    work, kept); returns its path and whether it was made."""
    ex = exercises()[number - 1]
    folders = list(dict.fromkeys([os.path.dirname(os.path.abspath(twin.__file__)), os.getcwd()]))
    for folder in folders:
        path = os.path.join(folder, copy_name(number))
        # A folder, a FIFO or a link to nothing there holds no work of a learner's.
        if os.path.lexists(path) and not os.path.isfile(path):
            raise ValueError(f"{shown(path)} is there and is not a file: move it away, then run "
                             f"--exercise {number} again")
        if os.path.lexists(path):
            return path, False
    with open(twin.__file__, encoding="utf-8") as f:
        source = exercise_source(f.read(), number)
    reasons = []
    for folder in folders:
        path = os.path.join(folder, copy_name(number))
        made = False
        try:
            if not writable(folder):
                raise OSError(0, "it is read-only")
            with open(path, "x", encoding="utf-8") as f:
                made = True
                f.write(source)
            return path, True
        except OSError as e:
            # A copy cut short (a full disk) is no learner's work, and would be kept as theirs.
            if made:
                os.remove(path)
            reasons.append(f"{folder} ({e.strerror})")
    raise ValueError(f"cannot write {copy_name(number)} in {' nor in '.join(reasons)}: run it from "
                     f"a folder you may write to")


def shown(path):
    """path as a command typed here takes it: relative to the current folder where that is
    shorter, quoted for the shell where it must be."""
    relative = os.path.relpath(path)
    return shlex.quote(relative if len(relative) < len(os.path.abspath(path)) else
                       os.path.abspath(path))


def grading_command(path, name):
    """The command that grades the copy at path with --check name, from the current folder: the
    copy itself where workbook.py is beside it, else workbook.py given the copy."""
    if os.path.dirname(os.path.abspath(path)) == HERE:
        return f"python {shown(path)} --check {name}"
    return f"python {shown(os.path.join(HERE, 'workbook.py'))} {shown(path)} --check {name}"


# --------------------------------------------------------------------------------------- the demo
class Parser(argparse.ArgumentParser):
    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        # Numbers argparse would take for options (-1e-3, -inf): no option here starts with a minus and a digit.
        self._negative_number_matcher = re.compile(r"-(\.?\d|inf$|infinity$|nan$)", re.IGNORECASE)

    def error(self, message):
        # argparse's message on one line, without the usage block above it.
        self.exit(2, f"{self.prog}: error: {message} (see --help)\n")


def seconds_type(text):
    value = float(text)
    # Written so that NaN fails it too.
    if not 0 < value < 1e6:
        raise argparse.ArgumentTypeError(f"must be in (0, 1e6), got {text}")
    return value


# The marks that turn the direction of the text after them, as a terminal shows it.
TURNS = set("\u061c\u200e\u200f\u202a\u202b\u202c\u202d\u202e\u2066\u2067\u2068\u2069")


def visible(text):
    """text with its controls (but a line's end and the tab), lone surrogates, non-characters, the
    marks that turn a line and tag characters written as escapes, as \\x1b: a text's characters, or
    a path given, may hold a terminal's escape, or text hidden in plain sight. As report.visible,
    whose rule (cli.hidden) this side may not import: it never imports torch."""
    return "".join(c.encode("unicode_escape").decode("ascii") if c not in "\n\r\t" and (
        unicodedata.category(c) in ("Cc", "Cs", "Cn") or c in TURNS or "\U000e0000" <= c <= "\U000e007f")
        else c for c in text)


def read_text(path, block_size):
    """The text at path, refused in one line unless it is UTF-8 and its last 10% holds one example
    of block_size."""
    if not path:
        raise ValueError("the path of the text is empty: give the path of a UTF-8 text file")
    try:
        # A folder; or a device or a pipe, which could be read forever.
        if not os.path.isfile(path):
            os.stat(path)  # raises what keeps it from being read: none there, a loop of links, ...
            raise OSError(0, "it is not a file")
        # Its line ends as they are, as train.py reads a text: a CRLF text keeps its "\r".
        with open(path, encoding="utf-8", newline="") as f:
            text = f.read()
    except (OSError, UnicodeDecodeError) as e:
        reason = e.strerror if isinstance(e, OSError) else "it is not UTF-8 text"
        raise ValueError(f"cannot read {visible(path)} ({reason}): give the path of a UTF-8 text "
                         f"file") from None
    # As train.py has it: a text never holds NUL bytes, binary data does.
    if "\0" in text:
        raise ValueError(f"{visible(path)} holds NUL bytes, so it is binary data, not a text: give "
                         f"the path of a UTF-8 text file")
    if len(text) - int(0.9 * len(text)) <= block_size + 1:
        least = 10 * (block_size + 2) + 10
        raise ValueError(f"{visible(path)} has {len(text)} characters: its last 10%, held out for "
                         f"validation, must hold {block_size + 2}: give a text of {least} or more")
    return text


def twin_problem(twin):
    """What a copy of gpt_numpy.py (a learner's exercise) lacks that the check and the training
    use, in a few words; None if nothing. A copy made before the lesson changed lacks a field or a
    function."""
    lacks = [name for name in dir(gpt_numpy) if name.endswith(("_forward", "_backward"))
             or name in ("GPT", "GPTConfig", "init_params", "rope_tables")]
    lacks = [name for name in lacks if not hasattr(twin, name)]
    if lacks:
        return f"it has no {lacks[0]}"
    fields = getattr(twin.GPTConfig, "__dataclass_fields__", {})
    missing = [name for name in gpt_numpy.GPTConfig.__dataclass_fields__ if name not in fields]
    return f"its GPTConfig has no field {missing[0]}" if missing else None


# The demo's batch: rows of a context of this many characters.
DEMO_ROWS, DEMO_CONTEXT = 16, 64


def main(argv=None, twin=gpt_numpy):
    """The command line of python gpt_numpy.py, run on twin: gpt_numpy itself or a learner's copy
    of it, whose --check grades the copy."""
    # A character stdout cannot encode (a path's, on an ASCII terminal) prints as an escape, not
    # an error.
    if hasattr(sys.stdout, "reconfigure"):
        sys.stdout.reconfigure(errors="backslashreplace")
    parser = Parser(description="The NumPy twin: check its gradients, or train a tiny GPT with "
                                "NumPy alone.")
    # No defaults here: None tells that --check or --exercise was given a training input.
    parser.add_argument("path", nargs="?", help="text to train on (default: input.txt)")
    parser.add_argument("--seconds", type=seconds_type, help="training time (default: 60)")
    parser.add_argument("--check", nargs="?", const=True, metavar="NAME",
                        help="instead: check every gradient by finite differences, or one "
                             f"layer's and the models that use it: {'; '.join(CHECKS)}")
    parser.add_argument("--intermediates", action="store_true",
                        help="with --check: also GPT.backward's intermediates, each layer's dout "
                             "and input gradients, against the reference's, exact or close")
    parser.add_argument("--exercise", metavar="N",
                        help="instead: start exercise N of the workbook (write a backward, or "
                             "break one and predict the rows of --check that turn), or list "
                             "them: --exercise list")
    parser.add_argument("--answer", action="store_true", help="with --exercise N: its answer")
    parser.add_argument("--hint", nargs="?", type=int, const=0, metavar="K",
                        help="with --exercise N (or run in your copy, exercise_N.py): a write "
                             "exercise's hints, one more each time; with K, the first K")
    parser.add_argument("--train", action="store_true",
                        help="instead: train the check's model a few seconds with this file's "
                             "backward beside the reference's, the same seed and batches")
    args = parser.parse_args(argv)
    if args.answer and args.exercise in (None, "list"):
        parser.error("--answer goes with --exercise N")
    if args.hint is not None:
        if args.answer or args.train or args.check is not None or args.exercise == "list" or (
                args.path is not None or args.seconds is not None):
            parser.error("--hint goes with --exercise N alone, or in your copy, exercise_N.py")
        mine = learners_function(twin)
        if args.exercise is None and mine is None:
            parser.error("--hint goes with --exercise N, or in your copy, exercise_N.py")
        number = args.exercise or os.path.basename(twin.__file__)[len("exercise_"):-len(".py")]
        try:
            if not (number.isdecimal() and 1 <= int(number) <= len(exercises())):
                raise ValueError(f"--exercise takes a number from 1 to {len(exercises())}; "
                                 f"not {number!r}")
            print(next_hint(int(number), twin, args.hint or None))
        except ValueError as e:
            sys.exit(f"error: {e}")
        return
    given = [mode for mode, on in (("--check", args.check is not None),
                                   ("--exercise", args.exercise is not None),
                                   ("--train", args.train)) if on]
    if len(given) > 1:
        parser.error(f"{' and '.join(given)} are {['two', 'three'][len(given) - 2]} modes: give one")
    if args.train and (args.path is not None or args.seconds is not None):
        parser.error("--train trains the check's model on tokens of its own, for a few seconds: "
                     "a text and --seconds go with the demo's training alone")
    if args.train:
        stale(twin)
        sys.exit(0 if train_beside(twin) else 1)
    if args.intermediates and args.check is None:
        parser.error("--intermediates goes with --check (or --check NAME)")
    # True for --check alone; any name given, "" too, must be a table's, or its function's.
    if isinstance(args.check, str):
        layer = args.check.lower().removesuffix("_backward")
        args.check = layer if layer in CHECKS else args.check
    if isinstance(args.check, str) and args.check not in CHECKS:
        names = ", ".join(f"'{name}'" for name in CHECKS)
        # A text given to it was meant for the training.
        what = "trains nothing: it " if os.path.exists(args.check) else ""
        parser.error(f"--check {what}checks every row, or a layer's named as its table names it "
                     f"({names}); not {args.check!r}")
    mode = "--check" if args.check else "--exercise" if args.exercise is not None else None
    if mode is not None and (args.path is not None or args.seconds is not None):
        parser.error(f"{mode} trains nothing: a text and --seconds go with the training alone")
    if args.exercise is not None:
        try:
            found = exercises()
        except ValueError as e:
            sys.exit(f"error: {e}")
        if args.exercise == "list":
            print(listing())
            return
        try:
            number = int(args.exercise)
        except ValueError:
            number = 0
        if not 1 <= number <= len(found):
            sys.exit(f"error: --exercise takes a number from 1 to {len(found)}, or list; not "
                     f"{args.exercise!r}")
        if "check" in found[number - 1] and not args.answer:
            try:
                # From gpt_numpy.py itself, beside it, whichever copy runs the command.
                path, made = start_exercise(number)
            except ValueError as e:
                sys.exit(f"error: {e}")
            if not made:
                print(f"({path} is there already, your work in it: it is kept as it is; delete "
                      f"it to start again)")
            print(exercise_text(number, path=path))
            return
        print(exercise_text(number, args.answer))
        return
    if args.check:
        only = None if args.check is True else args.check
        stale(twin)
        try:
            passed = check(twin=twin, only=only)
            if args.intermediates:
                for block in CHECKS[only][1] if only else ("gpt2", "llama"):
                    print()
                    passed = intermediates(block, GPT2 if block == "gpt2" else LLAMA, twin) is None and passed
        # Anything that ends the check before its last row (a body's sys.exit(0) outside a row):
        # never a pass.
        except SystemExit as e:
            sys.exit(f"error: the check stopped before its last row (SystemExit: {e.code}): it "
                     f"did not run every row, so it is no pass")
        sys.exit(0 if passed else 1)
    path = "input.txt" if args.path is None else args.path
    seconds = 60 if args.seconds is None else args.seconds
    try:
        text = read_text(path, DEMO_CONTEXT)
        chars = sorted(set(text))
        stoi = {ch: i for i, ch in enumerate(chars)}
        # Straight into the array: a list of the ids first would take twice the memory.
        data = np.fromiter(map(stoi.__getitem__, text), dtype=np.int64, count=len(text))
    except ValueError as e:
        sys.exit(f"error: {e}")
    except MemoryError:
        sys.exit(f"error: out of memory reading {path}: give a smaller text (a few MB is "
                 f"more than a minute's training reads)")
    stale(twin)
    try:
        demo(twin, data, chars, stoi, path, seconds)
    # A learner's copy that raises (a body not yet written, a shape slip): one line that says
    # where, as --train says it; the output's own failures are run()'s to say.
    except (Exception, SystemExit) as e:
        if isinstance(e, OSError) and not passed_through(e, twin):
            raise
        sys.exit(f"error: the model raised {raised_here(e, twin, learners_function(twin))}: "
                 f"python {shown(twin.__file__)} --check finds the first wrong piece")


def demo(twin, data, chars, stoi, path, seconds):
    """Trains twin's GPT on data (ids of chars, read from path) for seconds with AdamW, printing
    as it goes, then shows its val loss and a sample."""
    B, T = DEMO_ROWS, DEMO_CONTEXT
    n = int(0.9 * len(data))
    config = twin.GPTConfig(vocab_size=len(chars), block_size=T, n_layer=2, n_head=4, n_embd=64)
    model = twin.GPT(config, twin.init_params(config))
    optimizer = AdamW(model.params, lr=3e-3, weight_decay=0.1)
    rng = np.random.default_rng(0)
    prompt = np.array([[stoi["\n" if "\n" in stoi else chars[0]]]])

    def decode(ids):
        return "".join(chars[i] for i in ids)

    def batch(split):
        ix = rng.integers(len(split) - T, size=B)
        xy = np.stack([split[i:i + T + 1] for i in ix])  # (B, T + 1)
        return xy[:, :-1], xy[:, 1:]

    n_params = sum(w.size for w in model.params.values())
    print(f"training a {n_params:,}-parameter GPT ({config.n_layer} layers, {config.n_embd} wide, "
          f"context {T}) on {visible(path)} with NumPy alone, for {seconds:g} s")
    untrained = decode(generate(model, prompt, 60, generator=rng)[0, 1:])
    print(f"untrained, it writes: {untrained!r}")
    t0 = time.time()
    step = 0
    elapsed = last_report = 0.0
    try:
        # One step at least. The clock is read once a step, so that the step that ends a run of a
        # second or more always says where it got to.
        while step == 0 or elapsed < seconds:
            _, loss = model.forward(*batch(data[:n]))
            optimizer.step(model.backward())
            if step == 0:
                print(f"step 0: loss {loss:.3f} (a model that knows nothing scores "
                      f"ln({len(chars)}) = {math.log(len(chars)):.3f})", flush=True)
            step += 1
            elapsed = time.time() - t0
            if elapsed >= 1 and (elapsed - last_report >= max(seconds / 10, 1) or elapsed >= seconds):
                ms = elapsed / step * 1000
                print(f"{elapsed:.0f} s: step {step}, loss {loss:.3f}, {ms:.0f} ms/step",
                      flush=True)
                last_report = elapsed
    # Ctrl-C ends the training early; what the model has learned is still shown.
    except KeyboardInterrupt:
        print("Ctrl-C: training stopped (a second one quits)")
    ms_per_step = (time.time() - t0) / max(step, 1) * 1000
    val = np.mean([model.forward(*batch(data[n:]))[1] for _ in range(20)])
    print(f"after {step} steps at {ms_per_step:.0f} ms/step: val loss {val:.3f}\nsample:")
    print(visible(decode(generate(model, prompt, 300, temperature=0.8, generator=rng)[0, 1:])))


# The step of --train's plain gradient descent, at which the check's models learn in 120 steps.
TRAIN_LR = 0.3


def train_beside(twin, steps=120, log=print):
    """Trains the check's model (each block the learner's exercise uses) twice from the same
    weights on the same batches, by plain gradient descent: with twin's backward (the learner's)
    and with the reference's. Logs both losses; returns whether twin's matched the reference's at
    every step. Plain steps, not AdamW's: AdamW divides each gradient by its own size, so a
    gradient off by a constant factor would train as the right one does."""
    exercise = learners_exercise(twin)
    # Every function whose body the learner wrote (an exercise may blank two), by the check of it.
    written = [exercise["function"], *exercise.get("with", [])] if exercise else []
    names = [next((ex["check"] for ex in exercises() if ex["function"] == f and "check" in ex),
                  "model") for f in written] or ["model"]
    # Tokens of a rule the model can learn: each the one before times 3, plus 1, modulo V.
    data = np.zeros(400, dtype=np.int64)
    for i in range(1, len(data)):
        data[i] = (3 * data[i - 1] + 1 + (i % 50 == 0)) % V
    passed = True
    # What the learner's backwards return, step by step: float32 arrays part a run from the
    # reference's by their rounding alone.
    returned = []
    restore = watching_backwards(twin, [], returned)
    try:
        for block in dict.fromkeys(b for name in names for b in CHECKS[name][1]):
            name = next(name for name in names if block in CHECKS[name][1])
            passed = train_block(twin, block, name, data, steps, returned, log) and passed
    finally:
        restore()
    return passed


def train_block(twin, block, name, data, steps, returned, log):
    """train_beside's run of one block's model; name is the check that says where it parts.
    Returns whether the learner's losses kept to the reference's."""
    function = learners_function(twin)
    switches = GPT2 if block == "gpt2" else LLAMA
    config = model_config(gpt_numpy, switches, block_size=T + 1)
    weights = gpt_numpy.init_params(config, seed=0, dtype=np.float64)
    models = {"yours": twin.GPT(model_config(twin, switches, block_size=T + 1),
                                {n: w.copy() for n, w in weights.items()}),
              "reference": gpt_numpy.GPT(config, {n: w.copy() for n, w in weights.items()})}
    rng = np.random.default_rng(0)
    losses = {who: [] for who in models}
    low = None  # the dtype of the learner's arrays, where less precise than float64
    log(f"training the check's {block} model {steps} steps with your backward (from "
        f"{os.path.basename(twin.__file__)}) and the reference's")
    with np.errstate(all="ignore"):
        for step in range(steps):
            ix = rng.integers(0, len(data) - T - 1, MB)
            xy = np.stack([data[i:i + T + 1] for i in ix])
            for who, model in models.items():
                try:
                    losses[who].append(float(model.forward(xy[:, :-1], xy[:, 1:])[1]))
                    with time_limit("GPT.backward"):
                        grads = model.backward()
                    for n, w in model.params.items():
                        w -= TRAIN_LR * grads[n]
                except (Exception, SystemExit) as e:
                    log(f"step {step}: your backward raised {raised_here(e, twin, function)}")
                    return False
                if low is None:
                    low = less_precise(returned + list(grads.values()))
                returned.clear()
            if step % 20 == 0 or step == steps - 1:
                log(f"step {step:3d}: loss yours {losses['yours'][-1]:.4f}, reference "
                    f"{losses['reference'][-1]:.4f}")
    # The same weights and batches: a right backward keeps the reference's losses to float64's
    # rounding, step for step; a wrong one parts from them.
    parted = [i for i, (a, b) in enumerate(zip(losses["yours"], losses["reference"]))
              if not abs(a - b) <= 1e-6 * (1 + abs(b))]
    if not parted:
        log(f"{block}: your gradients train as the reference's do")
        return True
    i = parted[0]
    # --check allows for float32's rounding; step after step, a run cannot tell it from a slip.
    where = (f"--check {name} says where" if low is None else f"your backward returns {low} arrays, "
             f"whose rounding alone parts a run from the float64 reference's: make them float64 to compare")
    log(f"{block}: your loss parted from the reference's at step {i} ({losses['yours'][i]:.6f} "
        f"against {losses['reference'][i]:.6f}; {losses['yours'][-1]:.4f} against "
        f"{losses['reference'][-1]:.4f} at the end): {where}")
    return False


def stale(twin):
    """Ends in one line if twin, a learner's copy, lacks what the check needs."""
    problem = None if twin is gpt_numpy else twin_problem(twin)
    if problem is not None:
        name = os.path.basename(getattr(twin, "__file__", "") or "your copy")
        number = name[len("exercise_"):-len(".py")] if name.startswith("exercise_") else "N"
        sys.exit(f"error: {name} was made from an older gpt_numpy.py ({problem}): rename it, run "
                 f"python gpt_numpy.py --exercise {number} for a new copy, and write your body "
                 f"into that one")


def quiet_stdout():
    """Points stdout at /dev/null, so that the flush at exit does not fail a second time."""
    os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())


def run_copy(argv):
    """python workbook.py COPY [--check NAME | ...]: runs COPY, a learner's copy of gpt_numpy.py made
    where workbook.py is not, as python COPY would run it beside workbook.py."""
    if argv[:1] in (["-h"], ["--help"]):
        print("usage: python workbook.py exercise_N.py [what python gpt_numpy.py takes]: runs your "
              "copy of gpt_numpy.py, made where workbook.py is not, as python exercise_N.py would "
              "run beside it; python gpt_numpy.py --help lists what it takes")
        sys.exit(0)
    if not argv:
        sys.exit("error: python workbook.py takes the path of your copy of gpt_numpy.py first "
                 "(exercise_N.py): python workbook.py --help says more")
    path = argv[0]
    if not (path.endswith(".py") and os.path.isfile(path)):
        sys.exit(f"error: python workbook.py takes the path of your copy of gpt_numpy.py first "
                 f"(exercise_N.py), not {path!r}")
    spec = importlib.util.spec_from_file_location("learners_copy", path)
    module = importlib.util.module_from_spec(spec)
    try:
        spec.loader.exec_module(module)
    except (Exception, SystemExit) as e:
        sys.exit(f"error: {path} cannot be imported: {raised_here(e, module)}")
    sys.argv = [path, *argv[1:]]
    run(module)


def run(twin):
    """python gpt_numpy.py ...: main on twin, its output's failures each in one line."""
    guarded(main, twin=twin)


def guarded(command, *args, **kwargs):
    """Runs command(*args, **kwargs), a command line's whole work: a reader gone away, output that
    cannot be written and Ctrl-C each end it in one line, never a traceback."""
    try:
        command(*args, **kwargs)
    # The reader went away (python gpt_numpy.py --check | head): end quietly, as cat does.
    except BrokenPipeError:
        quiet_stdout()
        sys.exit(141)
    # The output cannot be written (a full disk): one line, not a traceback.
    except OSError as e:
        quiet_stdout()
        sys.exit(f"error: cannot write the output ({e.strerror or e})")
    # Ctrl-C outside the training (or a second one): quit without a traceback.
    except KeyboardInterrupt:
        print()
        sys.exit(130)


if __name__ == "__main__":
    guarded(run_copy, sys.argv[1:])
