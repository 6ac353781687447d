"""GradCache: a contrastive step over a batch far larger than fits in memory, with the exact large-batch gradient.

The loss couples every question with every passage, so plain gradient accumulation would shrink the negatives
pool. GradCache splits the step in three (Gao et al., 2021):

1. encode every chunk without a graph, saving the RNG state before each chunk (outside DDP the last call keeps its
   graph, and step 3 backpropagates it instead of encoding it again);
2. compute the loss on the detached representations (the fused loss: no B×N buffer) and backpropagate to them,
   which gives dL/d(representation) for every question and passage (scaled when a grad scaler is used);
3. re-encode each chunk with its RNG state restored (so dropout draws the same masks) and backpropagate the
   cached gradient into the encoder, the question chunk before the passage chunk of a call, so that only one
   tower's graph is alive at a time. Under DDP every call but the last runs inside ``no_sync()``, so gradients are
   all-reduced once per step, and a call's two chunks are encoded together (DDP must see both towers in the last
   one).

Memory is then one chunk's activations plus the B×d and N×d representations, whatever the batch size.

Usage (``model`` is a ``BiEncoder``, whose ``forward(q_tokens, p_tokens)`` returns both sides)::

    step = GradCacheStep(model)
    q_chunks, q_back = length_sorted_chunks(model.tokenize_questions(questions), 32)
    p_chunks, p_back = length_sorted_chunks(model.tokenize_passages(passages), 32)
    loss = step(q_chunks, p_chunks, lambda q, p: inbatch_nll(q[q_back], p[p_back], targets),
                backward=lambda t: t.backward())
    optimizer.step()
"""
from __future__ import annotations

import contextlib
from typing import Callable, ContextManager, Sequence

import torch

Tokens = dict  # str -> Tensor, one chunk of tokenised text


class RandomState:
    """The CPU and CUDA generator states at one point, to replay the same random draws (dropout) later."""

    def __init__(self, cuda_devices: Sequence[torch.device] = ()):
        self.cpu = torch.get_rng_state()
        self.cuda = [(d, torch.cuda.get_rng_state(d)) for d in cuda_devices]

    def restore(self) -> None:
        torch.set_rng_state(self.cpu)
        for device, state in self.cuda:
            torch.cuda.set_rng_state(state, device)


def chunk_schedule(n_question_chunks: int, n_passage_chunks: int) -> list[tuple[int | None, int | None]]:
    """Pair question and passage chunks into encoder calls, aligned at the end so that the last call encodes both.

    With separate towers a call that used only one tower would leave the other tower's gradients unreduced when
    DDP synchronises on the last call."""
    n = max(n_question_chunks, n_passage_chunks)
    calls = []
    for k in range(n):
        qi = k - (n - n_question_chunks)
        pi = k - (n - n_passage_chunks)
        calls.append((qi if qi >= 0 else None, pi if pi >= 0 else None))
    return calls


def split_tokens(tokens: Tokens, chunk_size: int) -> list[Tokens]:
    n = next(iter(tokens.values())).shape[0]
    return [{k: v[i : i + chunk_size] for k, v in tokens.items()} for i in range(0, n, chunk_size)]


def trim_padding(tokens: Tokens) -> Tokens:
    """Drop trailing columns that are padding in every row (right-padded input), so a chunk costs its own length."""
    mask = tokens["attention_mask"]
    width = int(mask.sum(dim=1).max()) if mask.numel() else 0
    if width == mask.shape[1]:
        return tokens
    return {k: (v[:, :width] if v.dim() == 2 and v.shape[1] == mask.shape[1] else v) for k, v in tokens.items()}


def length_sorted_chunks(tokens: Tokens, chunk_size: int) -> tuple[list[Tokens], torch.Tensor]:
    """Split a right-padded batch into chunks of rows of similar length, shortest first, each trimmed to its own
    longest row; returns the chunks and ``restore``, the index that puts the chunks' concatenated outputs back in
    the batch's order (``torch.cat(outputs)[restore]``). Shortest first puts the longest chunk last, where
    :class:`GradCacheStep` keeps the graph of the first pass instead of encoding it twice.

    A batch is padded to its longest text, and a chunk of rows taken in batch order almost always holds one such
    row, so every chunk would cost the full width. Sorted, the chunks of short texts are short: on SQuAD triples cut
    at 128 tokens this removes about two thirds of the padded positions (32,768 → 30,080 passage positions at batch
    128, 28,642 of them tokens). The loss sees the rows in batch order, so the gradient is the same; only which
    dropout draws fall on which row changes. ``BiEncoder.encode`` sorts by length too, at inference. ``restore`` is
    on the tokens' device."""
    lengths = tokens["attention_mask"].sum(dim=1)
    order = torch.argsort(lengths, stable=True)
    n = lengths.shape[0]
    ordered = {k: (v.index_select(0, order) if v.dim() >= 1 and v.shape[0] == n else v) for k, v in tokens.items()}
    return [trim_padding(t) for t in split_tokens(ordered, chunk_size)], torch.argsort(order)


class GradCacheStep:
    """Runs one GradCache step of ``encoder``, a module called as ``encoder(q_tokens, p_tokens) -> (q, p)`` where
    either argument may be None (then so is its output), encoding the questions before the passages. ``encoder``
    may be DDP-wrapped."""

    def __init__(
        self,
        encoder: torch.nn.Module,
        autocast: Callable[[], ContextManager] = contextlib.nullcontext,
        cuda_devices: Sequence[torch.device] = (),
    ):
        self.encoder = encoder
        self.autocast = autocast
        self.cuda_devices = list(cuda_devices)

    def __call__(
        self,
        q_chunks: list[Tokens],
        p_chunks: list[Tokens],
        loss_from_reps: Callable[[torch.Tensor, torch.Tensor], torch.Tensor],
        backward: Callable[[torch.Tensor], None],
    ) -> torch.Tensor:
        """``loss_from_reps(q, p)`` maps this rank's question and passage representations (in the encoder's
        precision, in chunk order) to the loss to differentiate; ``backward(loss)`` runs its backward pass (e.g. through a grad
        scaler). Returns the loss, detached."""
        calls = chunk_schedule(len(q_chunks), len(p_chunks))
        no_sync = getattr(self.encoder, "no_sync", None)
        # Outside DDP the last call keeps its graph from the first pass and is backpropagated first in the third,
        # which spares re-encoding one chunk; its graph is alive while the loss is computed, which costs no more
        # than the re-encoded chunk would. DDP must see the last call's backward last, so there it is re-encoded.
        keep_last = no_sync is None

        # 1. representations without a graph (but the kept call's); remember each call's RNG state
        states, q_reps, p_reps, kept = [], [], [], []
        for k, (qi, pi) in enumerate(calls):
            states.append(RandomState(self.cuda_devices))
            keep = keep_last and k == len(calls) - 1
            with (contextlib.nullcontext() if keep else torch.no_grad()), self.autocast():
                q, p = self.encoder(q_chunks[qi] if qi is not None else None, p_chunks[pi] if pi is not None else None)
            if keep:
                kept = [out for out in (q, p) if out is not None]
                q, p = (q.detach() if q is not None else None), (p.detach() if p is not None else None)
            # the encoder's own precision goes into the loss (which accumulates in fp32), as without GradCache
            if q is not None:
                q_reps.append(q)
            if p is not None:
                p_reps.append(p)
        after_encoding = RandomState(self.cuda_devices)

        # 2. loss and its gradient with respect to the representations (a side without chunks, e.g. a frozen
        # passage tower whose vectors the loss brings itself, is None)
        q_all = torch.cat(q_reps).requires_grad_(True) if q_reps else None
        p_all = torch.cat(p_reps).requires_grad_(True) if p_reps else None
        loss = loss_from_reps(q_all, p_all)
        backward(loss)
        q_grads = q_all.grad.split([r.shape[0] for r in q_reps]) if q_reps else ()
        p_grads = p_all.grad.split([r.shape[0] for r in p_reps]) if p_reps else ()
        del q_all, p_all, q_reps, p_reps

        # 3. re-encode chunk by chunk with the same random draws and push the cached gradients into the encoder
        if kept:
            qi, pi = calls[-1]
            grads = ([q_grads[qi]] if qi is not None else []) + ([p_grads[pi]] if pi is not None else [])
            torch.autograd.backward(kept, grads)
            del kept
            calls, states = calls[:-1], states[:-1]
        for k, ((qi, pi), state) in enumerate(zip(calls, states)):
            last = k == len(calls) - 1
            context = no_sync() if (no_sync is not None and not last) else contextlib.nullcontext()
            with context:
                state.restore()
                if no_sync is None:
                    # one tower's graph alive at a time: the questions' chunk is encoded and backpropagated before
                    # the passages' one, which draws the same random numbers as the joint call (it encodes
                    # questions first). DDP needs the joint call, to see both towers in the last one
                    if qi is not None:
                        self._backward_one(q_chunks[qi], None, q_grads[qi])
                    if pi is not None:
                        self._backward_one(None, p_chunks[pi], p_grads[pi])
                    continue
                with self.autocast():
                    q, p = self.encoder(q_chunks[qi] if qi is not None else None, p_chunks[pi] if pi is not None else None)
                outputs, grads = [], []
                if q is not None:
                    outputs.append(q)
                    grads.append(q_grads[qi])
                if p is not None:
                    outputs.append(p)
                    grads.append(p_grads[pi])
                torch.autograd.backward(outputs, grads)
        # leave the generators where a single pass over the batch would have left them
        after_encoding.restore()
        return loss.detach()

    def _backward_one(self, q_tokens: Tokens | None, p_tokens: Tokens | None, grad: torch.Tensor) -> None:
        with self.autocast():
            q, p = self.encoder(q_tokens, p_tokens)
        (q if q is not None else p).backward(grad)
