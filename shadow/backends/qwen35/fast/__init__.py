"""The fast path: merged projections, fused kernels and CUDA graphs, reading one session's chunk
or a batch of sessions' chunks in one forward.

Its objects, each owning its state: ``FastForward`` (``forward.py``: the layers and the passes, the
one object the reader holds), ``Graphs`` (``graphs.py``: capture, the warm-up check, what it refused,
the report), ``StateSlots`` (``slots.py``: the static conv and recurrent state), ``Staging``
(``staging.py``: each row count's static tensors and inputs), ``Fork`` (``fork.py``), the piecewise
form (``piecewise.py``), the fused MLP kernel (``gate_up.py``) and the warm start (``warm.py``). The
parts see the forward through narrow Protocols of their own, so no part imports it.

A read's pass (``grid`` rows a session, or a span's ``k * grid``) is one captured graph for every
depth and every set of sessions: its attention reads each chunk's start, split rule and KV
addresses from a table staged with its ids (``AttentionBackend.attend_table``, ``attention.table.write_rows``), so each
session's KV rows stay in its own buffers, growing in 8,192-row steps: no reservation of a maximum
length, no paging. A fork's pass (questions, decode) is one graph too, with a one-entry table
(``fork.py``); where our kernel does not serve the grid, both run piecewise graphs around attention,
which runs eagerly between them (``piecewise.py``). Neither sizes anything from a buffer's capacity,
which would change bits as the buffer grew.

Per-session state that the graphs touch lives in static buffers: the conv and recurrent state of
``max_batch`` slots, copied in before a forward and, for a chunk that commits, copied out after it
(about 19 MB each way a session at 0.8B; a read's sessions in one launch a kind inside its graph,
``StateSlots``). KV rows are written straight into each session's own buffers, inside a pass's graph
or eagerly between a piecewise pass's pieces (``piecewise.py``). A fork (question, decode; ``fork.py``) uses
slot 0 and copies in, never out, so the committed state is untouched by construction. A pass's
inputs cross in one copy from pinned host memory (``staging.py``).

A batch: B sessions, each at its own depth, read their next chunk in one pass of ``B * grid`` rows,
session b's rows at ``[b * grid, (b + 1) * grid)``. Each session's tensors equal its chunk read
alone, bit for bit, whatever it is batched with, because every piece computes a session's numbers
from that session's alone, in the same order:
- row-wise kernels (embedding, norms, SiLU, gates, q/k norm and RoPE, output gate, gated norm):
  one row's result is a function of that row (and its session's start) only;
- the conv: a program holds rows of one session and reads that session's held columns
  (``kernels.conv_silu`` with a state per session);
- GDN: fla's kernels with the sessions as their batch axis; a program's sequence comes from its
  program id, so one session's programs run the same code on the same numbers (``gdn_fla``);
- attention: each chunk's programs read that chunk's row of the table only, and run ``attend``'s
  code on it, its split rule a function of that chunk's depth alone;
- GEMMs over the concatenated rows: cuBLAS computes a row from that row and the weight, in an
  order fixed by the kernel it picks; the kernel may change with the row count (split K, say), so
  this is checked rather than assumed. At warm-up every captured batch size reads random sessions
  at mixed depths and compares each with the same session read alone (``Graphs.check``); a size
  that differs is not used, and the log and ``report()`` say so. The MLP's gate/up GEMM and SiLU
  run as one kernel where that gives cuBLAS's bits and is faster (``gate_up.py``). Without CUDA the
  GEMMs run per session, which keeps the eager path invariant by construction: on the dev CPU
  concatenated rows did give a session's bits (the 0.8B's shapes and the tiny model's, fp32 and
  bf16), but nothing documents that the CPU library's blocking ignores the row count, and the eager
  path has no warm-up check to catch it.

A span: one pass reads k consecutive chunks of each of its sessions (``k * grid`` rows a session),
each session's chunks in the bits of reading them one pass each: the rows are the same and so is
everything row-wise; the conv takes a chunk's held columns from the rows before it, the very values
a chunk's state would hold; fla's state kernel carries the recurrent state across the chunks in
fp32, as the slots carry it between passes (``benchmarks/probes/gdn_span.py``: bit-equal on the
H200); attention takes each chunk as an entry of its own, at that chunk's own start. Spans are
captured and checked only for the sizes ``FastForward(spans=...)`` names (the service's ``SPANS``
setting: 2 to 16 chunks on CUDA, none elsewhere).

Row counts: a read uses ``B * grid`` rows for each batch size B; a fork runs whole ``grid`` passes
and then one padded pass of the smallest captured size that holds the rest. Padding rows come after
the real ones: attention is causal, and the gate kernel gives them no decay and no write
(``valid``), so they change neither the real rows' outputs nor the state the next step continues.

Exactness: a chunk at any depth runs the same captured kernels with the same fixed configurations,
so reading a session over many turns gives the bits of a fresh prefill on the same grid, on this
path, in any process. Against the torch forward the fast path agrees within bf16 rounding (its
kernels round once where the torch forward rounds at every op).

Without CUDA (the tests) the same pieces run eagerly, the Triton kernels under Triton's
interpreter, and the GDN's conv and rule through their torch forms, one session at a time.
"""
