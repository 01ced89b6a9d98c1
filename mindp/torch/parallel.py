"""DataParallel: a torch module whose gradients go to the network and whose parameters come back
(the package docstring, mindp/torch/__init__.py, shows its use)."""
from __future__ import annotations

import contextlib
import time
from typing import Callable

import numpy as np
import torch

from host_agent import optim
from mindp import listed
from mindp.layout import Layout
from mindp.lossscale import LossScaler

from . import widened


def trained(module: torch.nn.Module) -> list[tuple[str, torch.nn.Parameter]]:
    """The parameters the network trains: those that require a gradient. A frozen one
    (requires_grad=False) is left out of the layout, as DDP leaves it out of its buckets; it stays
    what each rank's module holds."""
    return [(n, p) for n, p in module.named_parameters() if p.requires_grad]


def layout_arrays(module: torch.nn.Module) -> dict[str, np.ndarray]:
    """The trained parameters as float32 numpy arrays, in chunk order (reverse registration)."""
    return {n: p.detach().float().cpu().numpy().copy() for n, p in reversed(trained(module))}


def layout_of(module: torch.nn.Module) -> Layout:
    return optim.layout_of(layout_arrays(module))


#: Elements same_bits compares at a time through torch (a parameter not float32 and contiguous, or
#: no numba): 256 KiB of float32 scratch, in a core's L2 (a Python loop's turn a block).
CHECK_BLOCK = 65536
_BITS = {1: torch.int8, 2: torch.int16, 4: torch.int32, 8: torch.int64}  # an element's bits, by its size

CHANGED_HINT = "the switch sums the gradients as backward() produces them; docs/TORCH.md"


def same_bits(p: torch.Tensor, values: np.ndarray, scratch: dict[torch.dtype, torch.Tensor],
              compiled: bool | None = None) -> bool:
    """Whether p holds `values` as finish() wrote them (copied into p's dtype), bit for bit:
    CHECK_BLOCK elements at a time through the caller's `scratch` (a block per dtype, reused: a
    whole copy each step was fresh pages each step, the kernel zeroing them in page faults). A
    float32 parameter (most are) is compared in one compiled pass instead (widened.same) where
    `compiled` (default: widened.COMPILED, where numba is)."""
    if (widened.COMPILED if compiled is None else compiled) and p.dtype == torch.float32 \
            and p.device.type == "cpu" and p.is_contiguous() and values.dtype == np.float16:
        return widened.same(p.detach().view(-1).numpy().view(np.uint32), values.reshape(-1).view(np.uint16))
    flat, v = p.detach().reshape(-1), torch.from_numpy(values.reshape(-1))
    block = scratch.get(p.dtype)
    if block is None:
        block = scratch[p.dtype] = torch.empty(CHECK_BLOCK, dtype=p.dtype)
    bits = _BITS[p.element_size()]
    for i in range(0, flat.numel(), CHECK_BLOCK):
        part = block[: min(CHECK_BLOCK, flat.numel() - i)]
        part.copy_(v[i : i + len(part)])
        if not torch.equal(flat[i : i + len(part)].view(bits), part.view(bits)):
            return False
    return True


class GradientChanged(RuntimeError):
    """A gradient was modified between backward() and step(): the change would be silently lost."""


class DataParallel:
    """Wraps a module and a host_agent.worker.WorkerAgent whose layout is layout_of(module)."""

    def __init__(self, module: torch.nn.Module, agent, scaler: LossScaler | None = None,
                 error: Callable[[str], BaseException] = GradientChanged, find_unused_parameters: bool = False):
        """error: what a refused gradient raises, from its message (during backward(), from the hook).
        find_unused_parameters: a trained parameter without a gradient in a step is sent as zeros
        (DDP's keyword); without it such a step is refused, as DDP refuses it by default."""
        self.module = module
        self.find_unused_parameters = find_unused_parameters
        self.error = error
        self._sync = True  # no_sync() clears it
        self.agent = agent
        self.scaler = scaler
        self.named = dict(trained(module))
        odd = [f"{n} ({str(p.dtype).removeprefix('torch.')})" for n, p in self.named.items() if not p.is_floating_point()]
        if odd:
            raise ValueError(f"{listed(odd, 3)}: the switch sums real floating-point gradients; train complex "
                             "parameters as their real and imaginary parts (torch.view_as_real)")
        want = [s.name for s in layout_of(module).specs]
        if [s.name for s in agent.layout.specs] != want:
            raise ValueError("the agent's layout is not layout_of(module) (names or order differ)")
        self._handle = None
        self.backward_seconds = 0.0  # step()'s last backward
        self.backward_cpu = 0.0  # its CPU seconds in this thread (the hooks' sends included)
        self.hooks_cpu = 0.0  # of those, the hooks' own: the gradients into frames, the pump nudged
        self.wait_seconds = 0.0  # the last finish()'s wait for the step's parameters (after backward)
        self._pushed: dict[str, tuple[int, int]] = {}  # name -> (id, version) of the gradient the hook sent
        self._written = self._stamps()  # each parameter as the network last left it
        self._values: dict[str, np.ndarray] = {}  # the fp16 values finish() last wrote (see _check_values)
        self._scratch: dict[torch.dtype, torch.Tensor] = {}  # same_bits's, a dtype each
        # called once a step before its first gradient leaves (a script Optimizer checks its lr there)
        self.before_send: Callable[[], None] | None = None
        self.hooks = [p.register_post_accumulate_grad_hook(self._hook(name)) for name, p in self.named.items()]
        widened.warm()

    def _syncing(self) -> bool:
        """Whether a backward() sends: not under no_sync(), nor while the module's
        require_backward_grad_sync is False (the attribute DDP's no_sync sets, and nanoGPT's
        accumulation loop sets itself on the model)."""
        return self._sync and bool(getattr(self.module, "require_backward_grad_sync", True))

    def _hook(self, name: str):
        def ready(p: torch.Tensor) -> None:
            if self._handle is not None and self._syncing():
                if name in self._pushed:
                    raise self.error(f"a second backward() in one step accumulated into the gradient of {name} after "
                                     "the first sent it: run the earlier backward() calls under `with opt.no_sync():` (or with "
                                     "model.require_backward_grad_sync = False), as with DDP; or a parameter used in "
                                     "several torch.utils.checkpoint(use_reentrant=True) segments: use_reentrant=False "
                                     f"({CHANGED_HINT})")
                cpu = time.thread_time()
                if not self._pushed and self.before_send:
                    self.before_send()
                self._put(self._handle, name, self._dense(name, p.grad))
                self._pushed[name] = (id(p.grad), p.grad._version)
                self.hooks_cpu += time.thread_time() - cpu
        return ready

    def _dense(self, name: str, grad: torch.Tensor) -> torch.Tensor:
        if grad.layout != torch.strided:
            raise self.error(f"the gradient of {name} is sparse (nn.Embedding(sparse=True)?): the switch sums dense "
                             "gradients; build the module with sparse=False")
        return grad

    def _unscaled(self, grad: torch.Tensor) -> torch.Tensor:
        return grad / self.scaler.scale if self.scaler else grad

    def _by_blocks(self, grad: torch.Tensor) -> bool:
        """Whether the agent divides `grad` by the loss scale itself, a block at a time (float32 on
        the CPU: numpy's float32 division, torch's bits), instead of a quotient tensor made for it."""
        return bool(self.scaler) and grad.dtype == torch.float32 and grad.device.type == "cpu"

    def _put(self, h, name: str, grad: torch.Tensor) -> None:
        if self._by_blocks(grad):
            h.put(name, grad, self.scaler.scale)
        else:
            h.put(name, self._unscaled(grad))

    @contextlib.contextmanager
    def no_sync(self):
        """Gradients accumulate and stay here (DDP's no_sync): the backward() after the block, or
        finish(), sends their sums."""
        self._sync = False
        try:
            yield
        finally:
            self._sync = True

    def _stamps(self) -> dict[str, tuple]:
        """Each parameter's version counter, storage, dtype and device: an in-place op moves the
        first; `p.data = ...`, .to() or .double() the others (an edit through .data moves none)."""
        return {name: (p._version, p.data_ptr(), p.dtype, p.device) for name, p in self.named.items()}

    def _check_parameters(self) -> None:
        """Refuse a module whose parameters changed outside the network: what the node holds would
        undo them without a word (a load_state_dict or an in-place edit after init), and the layout
        is fixed at init (a parameter frozen or unfrozen since)."""
        now = dict(trained(self.module))
        if now.keys() != self.named.keys() or any(now[n] is not p for n, p in self.named.items()):
            changed = sorted(now.keys() ^ self.named.keys()) or [n for n, p in self.named.items() if now[n] is not p]
            raise self.error(f"the trained parameters changed since init ({listed(changed, 3)}: requires_grad "
                             "set, or replaced): freeze or replace parameters before init, as before wrapping in DDP")
        edited = [n for n, v in self._stamps().items() if v != self._written[n]]
        if edited:
            raise self.error(f"{listed(edited, 3)} changed in place since the network last wrote the parameters "
                             "(load_state_dict, an edit, `.data =`, .to() or .double(), after init): the optimizer "
                             "node holds them and would undo it; load weights before init")

    def _check_values(self) -> None:
        """Refuse parameters whose values changed since finish() wrote them: an in-place edit through
        `.data` (WGAN's `p.data.clamp_()`) moves no version counter, and the node's next parameters
        would undo it without a word. The values written stay as they were in the agent's buffer
        until its next wait() returns (it receives a step into its other buffer): read, not copied.
        Compared as bits in the parameter's dtype (fp16 widens exactly to float32 and float64), so an
        Inf is the same as itself, and a NaN too (a float32 one: as any NaN, widened says why)."""
        edited = [n for n, p in self.named.items()
                  if n in self._values and not same_bits(p, self._values[n], self._scratch)]
        if edited:
            raise self.error(f"{listed(edited, 3)}: values changed since the network last wrote the parameters (an "
                             "in-place edit through .data, such as p.data.clamp_()): the optimizer node holds them "
                             "and its next parameters would undo it; change parameters through the model's loss, "
                             "or before init")

    def begin(self, set_to_none: bool = True) -> None:
        """Start a step: gradients from now on go to the network as autograd finishes each
        (set_to_none: as torch's zero_grad; False leaves zeros that backward() adds to)."""
        if self._handle is not None and self._pushed:
            raise self.error("zero_grad() after a backward() sent this step's gradients: the switch keeps the first "
                             "gradients of a step it gets, so they cannot be taken back; run a backward() you may "
                             "discard under `with opt.no_sync():`, or end the step with step()")
        self._check_parameters()
        self.module.zero_grad(set_to_none=set_to_none)
        self._pushed.clear()
        self.hooks_cpu = 0.0
        self._handle = self.agent.start_step()

    def finish(self) -> dict[str, np.ndarray]:
        """Push the gradients the hooks have not (all of them without begin()), wait for the step's
        parameters and write them into the module. Returns them as fp16 numpy arrays."""
        h, self._handle = self._handle, None
        if h is None:
            h = self.agent.start_step()
        self._check_unchanged(h)
        self._check_parameters()
        unused = [n for n, p in self.named.items() if n not in h.put_names and p.grad is None]
        if len(unused) == len(self.named):
            raise self.error("step() without a backward() since the last step(): no parameter has a gradient, and "
                             "the node would still take a step (weight decay, momentum, the schedule)")
        if unused and not self.find_unused_parameters:
            them = "it" if len(unused) == 1 else "them"
            raise self.error(f"{listed(unused, 3)}: no gradient in this step (the loss does not depend on {them}), "
                             f"and the node would still move {them} (weight decay and momentum on a zero gradient; "
                             "torch's optimizer skips a parameter without one): freeze such parameters before init "
                             "(requires_grad_(False)), or pass find_unused_parameters=True to send zeros")
        if not self._pushed and self.before_send:
            self.before_send()
        for name, p in self.named.items():  # gradients accumulated under no_sync, or zeros for unused ones
            if name not in h.put_names:
                if p.grad is None:
                    h.put(name, torch.zeros_like(p))
                else:
                    self._put(h, name, self._dense(name, p.grad))
        self._check_values()  # (here, while the step's last parameters are on their way)
        t = time.perf_counter()
        params = h.wait()
        self.wait_seconds = time.perf_counter() - t
        if self.scaler:
            self.scaler.update(bool(self.agent.nonfinite_chunks))
        with torch.no_grad():
            for name, p in self.named.items():  # fp16 to float32 in the copy (exact), no temporary
                p.copy_(torch.from_numpy(params[name]))
        self._written, self._values = self._stamps(), params
        self.module.zero_grad(set_to_none=True)
        self._pushed.clear()
        return params

    @property
    def pushed_any(self) -> bool:
        """Whether a backward() of the step in progress has sent a gradient."""
        return bool(self._pushed)

    def _check_unchanged(self, h) -> None:
        """Refuse a step whose gradients changed after the hook sent them (clip_grad_norm_, a manual
        rescale, an in-place op): the network already holds the values of backward() time. An edit
        through `.grad.data` (an old idiom: `p.grad.data.clamp_(-1, 1)`) moves no version counter:
        the step's frames, still holding what was sent, tell it."""
        for name, (ident, version) in self._pushed.items():
            g = self.named[name].grad
            if g is None or id(g) != ident or g._version != version or not self._holds(h, name, g):
                self._handle = None
                raise GradientChanged(f"the gradient of {name} changed after backward() sent it (clipping or "
                                      f"rescaling gradients is not supported: {CHANGED_HINT})")

    def _holds(self, h, name: str, g: torch.Tensor) -> bool:
        """h.holds of the gradient as _put sent it."""
        if self._by_blocks(g):
            return h.holds(name, g, self.scaler.scale)
        return h.holds(name, self._unscaled(g))

    def step(self, loss: torch.Tensor) -> dict[str, np.ndarray]:
        """Backward (with the loss scale), push every gradient, wait for the step's parameters and
        write them into the module. Returns them as fp16 numpy arrays. A step whose gradients were
        non-finite anywhere changes no parameter; the scale then backs off."""
        self.begin()
        t, cpu = time.perf_counter(), time.thread_time()
        (loss * self.scaler.scale if self.scaler else loss).backward()  # (a failure leaves the step to begin())
        self.backward_seconds = time.perf_counter() - t  # with the hooks' sends it overlaps
        self.backward_cpu = time.thread_time() - cpu
        return self.finish()

    def close(self) -> None:
        for hook in self.hooks:
            hook.remove()

