"""Words for diagram boxes, read from the graph: ops, their attributes and categories, the
shapes of parameters, and node metadata. What an op adds to a box comes from its row in the
diagram table (``ops.row``).

Every function takes the nodes it describes and returns plain text (lines joined by "\\n");
``diagram_style`` escapes it for DOT. Names that come from users (a graph's name, the node
names of a hand-built graph) are made one printable line (``words.name``).
"""

from __future__ import annotations

from tfgraph.exporters.diagram.ops import DIAGRAM_OPS, row
from tfgraph.exporters.diagram.structure import (
    Stack,
    box_id,
    box_key,
    boxes,
    layer_statements,
    placement,
    stacks,
    sublayer_ranks,
    users_in,
)
from tfgraph.exporters.diagram.style import count, gated_title, op_title
from tfgraph.exporters.diagram.words import (
    attention_kind,
    attention_title,
    linear_text,
    name,
    roles,
)
from tfgraph.graph.ir import Graph, Node
from tfgraph.graph.ops import OPS

SUBLAYER_WORDS = {"self_attn": "self-attention", "cross_attn": "cross-attention",
                  "ffn": "feed-forward"}


# ---- attention ------------------------------------------------------------------------------


def heads_text(att: Node) -> str:
    """``8 heads × 64``, with GQA / MQA and hardmax noted, from an attention op's attrs."""
    a = att.attrs
    heads, kv = a["heads"], a["kv_heads"]
    text = f"{heads} heads × {a['head_dim']}"
    if kv == 1 and heads != 1:
        text += ", 1 kv head (MQA)"
    elif kv != heads:
        text += f", {kv} kv heads (GQA)"
    if a.get("normalize") == "hardmax":
        text += ", hardmax"
    if a.get("scale") is not None:  # T5 (1), Gemma 2 (query_pre_attn_scalar^-0.5)
        text += f", scores × {a['scale']:.4g}"
    if a.get("softcap") is not None:  # Gemma 2
        text += f", scores capped at ±{a['softcap']:g}"
    return text


def window_text(graph: Graph, stack: Stack) -> str:
    """``sliding window 8: 1 local, 1 global layer`` for a stack with sliding windows."""
    windows = [n.attrs.get("window") for n in graph.ops()
               if n.category == "attention" and n.meta.stack == stack.name
               and n.attrs.get("kind") == "self"]
    local = [w for w in windows if w is not None]
    if not local:
        return ""
    if len(local) == len(windows):
        return f"sliding window {local[0]} in every layer"
    glob = len(windows) - len(local)
    return (f"sliding window {local[0]}: {len(local)} local, {glob} global "
            f"layer{'s' if glob > 1 else ''}")


def _period(kinds: list[str]) -> list[str]:
    """The shortest pattern that, repeated from the first layer, gives ``kinds``."""
    for p in range(1, len(kinds) + 1):
        if all(k == kinds[i % p] for i, k in enumerate(kinds)):
            return kinds[:p]
    return kinds


def _runs(pattern: list[str]) -> str:
    """``local ×5, global``: a layer pattern with runs folded."""
    out: list[tuple[str, int]] = []
    for kind in pattern:
        if out and out[-1][0] == kind:
            out[-1] = (kind, out[-1][1] + 1)
        else:
            out.append((kind, 1))
    return ", ".join(k if n == 1 else f"{k} \N{MULTIPLICATION SIGN}{n}" for k, n in out)


def window_pattern_text(graph: Graph, att: Node) -> str:
    """What keys the self-attention box of a layer diagram reads across the stack's layers:
    ``sliding window 4096 in every layer (the last 4096 keys)``, or ``sliding window 8 on local
    layers, global on the others`` and ``layers: local ×5, global, repeated`` (the pattern
    from the first layer; a global layer reads every earlier key, an encoder's every key; an
    encoder's window reads both sides). Empty without sliding windows. Read from the attention ops' ``window``
    attribute, so it is what the graph computes."""
    if att.attrs.get("kind") != "self":
        return ""
    layers = sorted((n.meta.layer, n.attrs.get("window")) for n in graph.ops()
                    if n.category == "attention" and n.meta.stack == att.meta.stack
                    and n.attrs.get("kind") == "self" and n.meta.layer is not None)
    windows = [w for _, w in layers]
    local = [w for w in windows if w is not None]
    if not local:
        return ""
    if len(local) == len(windows) and len(set(local)) == 1:
        reads = (f"the last {local[0]} keys" if att.attrs["causal"]
                 else f"keys less than {local[0]} away on both sides")  # an encoder's
        return f"sliding window {local[0]} in every layer ({reads})"
    pattern = _period(["local" if w is not None else "global" for w in windows])
    return (f"sliding window {local[0]} on local layers, global on the others\n"
            f"layers: {_runs(pattern)}"
            + (", repeated" if len(pattern) < len(windows) else ""))


# ---- sublayer functions ---------------------------------------------------------------------


def attention_of(members: list[Node]) -> Node | None:
    return next((n for n in members if n.category == "attention"), None)


def sublayer_title(members: list[Node], sublayer: str) -> str:
    """What a sublayer's function is: the attention's title, 'Feed-forward' for linears
    around an activation, else the sublayer's name."""
    att = attention_of(members)
    if att is not None:
        return attention_title(att)
    if any(n.category == "activation" for n in members):
        return "Feed-forward"
    return SUBLAYER_WORDS.get(sublayer, sublayer).capitalize()


def projections_text(graph: Graph, members: list[Node]) -> list[str]:
    """The linears grouped by size: ``q, k, v, o: linear 512 → 512`` when all agree, else
    e.g. ``q, o: linear 2,048 → 2,048`` and ``k, v: linear 2,048 → 256`` (GQA)."""
    sizes: dict[str, list[str]] = {}
    for node in (n for n in members if n.category == "linear"):
        sizes.setdefault(linear_text(graph, node), []).extend(roles([node]))
    return [f"{', '.join(names)}: linear {text}" for text, names in sizes.items()]


def _from_other_stack(graph: Graph, node: Node) -> Node | None:
    """The first data input of ``node`` that another stack computes (the encoder output)."""
    for i in node.inputs:
        src = graph.node(i)
        if not src.is_param and src.meta.stack not in (node.meta.stack, None):
            return src
    return None


def external_text(graph: Graph, members: list[Node]) -> str:
    """``K, V from the encoder output`` for ops that read another stack."""
    readers = [n for n in members if _from_other_stack(graph, n) is not None]
    if not readers:
        return ""
    source = _from_other_stack(graph, readers[0])
    assert source is not None
    who = ", ".join(r.upper() for r in roles(readers))
    return f"{who} from the {source.meta.stack} output"


def op_lines(graph: Graph, members: list[Node]) -> list[str]:
    """The lines the ops of a box add to its label (their rows' ``box_line``: clipping,
    qk-norm, rotary positions), one per op, in the order the graph computes them."""
    by_op: dict[str, list[Node]] = {}
    for node in members:
        by_op.setdefault(node.op, []).append(node)
    return [line(graph, nodes) for op, nodes in by_op.items()
            if (line := DIAGRAM_OPS[op].box_line) is not None]


def attention_text(graph: Graph, members: list[Node]) -> str:
    att = attention_of(members)
    assert att is not None
    lines = [attention_title(att), heads_text(att), window_pattern_text(graph, att),
             *projections_text(graph, members), *op_lines(graph, members),
             external_text(graph, members)]
    return "\n".join(line for line in lines if line)


def ffn_text(graph: Graph, members: list[Node]) -> str:
    """``ReLU, 512 → 2048 → 512`` or ``gated SwiGLU, 2048 → 5632 → 2048``: the activation
    op, whether an element-wise product gates it, and the widths of the first and last linear."""
    experts = experts_of(members)
    if experts is not None:  # a mixture of experts
        return experts_text(graph, experts)
    acts = [n for n in members if n.category == "activation"]
    linears = [n for n in members if n.category == "linear"]
    if not acts or not linears:
        return ", ".join(dict.fromkeys(n.op for n in members))
    act = acts[0].op
    gated = any(row(n).gates for n in members)
    word = f"gated {gated_title(act) or op_title(act)}" if gated else op_title(act)
    first, last = (graph.node(linears[i].inputs[1]).attrs["shape"] for i in (0, -1))
    return f"{word}, {first[1]} → {first[0]} → {last[0]}"


ROUTER_WORDS = {"softmax_topk": "softmax → top-k", "softmax_topk_renorm":
                "softmax → top-k → renormalised", "topk_softmax": "top-k → softmax"}


def _expert_word(experts: Node) -> str:
    act = experts.attrs["activation"]
    return f"gated {gated_title(act) or act}" if experts.attrs["gated"] \
        else op_title(act)


def experts_of(members: list[Node]) -> Node | None:
    """The op that makes a feed-forward a mixture of experts (its row's ``moe``), if any."""
    return next((n for n in members if row(n).moe), None)


def experts_text(graph: Graph, experts: Node) -> str:
    """``experts ×8, top-2: gated SwiGLU, 32 → 48 → 32`` (``×E, top-k``)."""
    count, hidden, d = graph.node(experts.inputs[-2]).attrs["shape"]  # up: (E, H, d)
    return (f"experts ×{count}, top-{experts.attrs['top_k']}: {_expert_word(experts)}, "
            f"{d} → {hidden} → {d}")


def moe_text(graph: Graph, members: list[Node]) -> str:
    """``Mixture of experts`` with the router, ``experts ×8, top-2: gated SwiGLU, 32 → 48 →
    32`` and the shared experts, from a mixture-of-experts feed-forward's nodes."""
    experts = experts_of(members)
    assert experts is not None
    route = graph.node(experts.inputs[1])  # the routing weights the experts read
    count, _, d = graph.node(experts.inputs[-2]).attrs["shape"]  # up: (E, H, d)
    word = _expert_word(experts)
    lines = ["Mixture of experts",
             f"router: linear {d} → {count}, {ROUTER_WORDS.get(route.attrs['router'], '')}",
             experts_text(graph, experts)]
    shared = [n for n in members if n.category == "linear" and n.meta.role.startswith("shared.")]
    if shared:
        width = graph.node(shared[0].inputs[1]).attrs["shape"][0]
        gate = "".join(dict.fromkeys(row(n).shared_note for n in members))
        lines.append(f"shared experts: {word}, {d} → {width} → {d}{gate}")
    return "\n".join(lines)


def _later_experts(graph: Graph, members: list[Node]) -> tuple[int, list[Node]] | None:
    """For a dense feed-forward in a stack whose later layers have experts (ffn.dense_layers):
    the first such layer and its feed-forward's nodes; else None."""
    first = members[0].meta
    later = [n for n in graph.ops() if row(n).moe and n.meta.stack == first.stack]
    if not later or first.layer is None:
        return None
    meta = later[0].meta
    moe = [n for n in graph.ops() if n.meta.stack == meta.stack and n.meta.layer == meta.layer
           and n.meta.sublayer == meta.sublayer]
    return int(meta.layer or 0), moe


def _dense_layers(first_moe: int) -> str:
    return "layer 0" if first_moe == 1 else f"layers 0–{first_moe - 1}"


def _dense_then_moe(graph: Graph, members: list[Node]) -> str:
    """For a dense feed-forward in a stack whose later layers have experts (ffn.dense_layers):
    ``layers 0–2: gated SwiGLU, ...`` then ``layers 3–: Mixture of experts ...``; else ''."""
    later = _later_experts(graph, members)
    if later is None:
        return ""
    first_moe, moe = later
    return (f"Feed-forward\n{_dense_layers(first_moe)}: {ffn_text(graph, members)}\n"
            f"layers {first_moe}–: {moe_text(graph, moe)}")


def stack_ffn_text(graph: Graph, members: list[Node]) -> str:
    """The folded stack box's feed-forward line(s): ``FFN gated SwiGLU, ...``, or with dense
    first layers (ffn.dense_layers) one line for them and one for the expert layers."""
    later = None if experts_of(members) is not None else _later_experts(graph, members)
    if later is None:
        return f"FFN {ffn_text(graph, members)}"
    first_moe, moe = later
    return (f"FFN {_dense_layers(first_moe)}: {ffn_text(graph, members)}\n"
            f"FFN layers {first_moe}–: {ffn_text(graph, moe)}")


def fn_text(graph: Graph, members: list[Node]) -> str:
    """Label of a folded sublayer function (without annotations)."""
    if attention_of(members) is not None:
        return attention_text(graph, members)
    if experts_of(members) is not None:
        return moe_text(graph, members)
    if mixed := _dense_then_moe(graph, members):
        return mixed
    title = sublayer_title(members, members[0].meta.sublayer or "")
    return f"{title}\n{ffn_text(graph, members)}"


def fn_kind(members: list[Node]) -> str:
    """Palette kind of a folded sublayer function."""
    att = attention_of(members)
    return attention_kind(att) if att is not None else "ffn"


# ---- stacks ---------------------------------------------------------------------------------


def order_text(graph: Graph, stack: Stack) -> str:
    """``masked self-attention → cross-attention → feed-forward`` in the order the graph's
    edges impose; sublayers that read the same input are joined by ``∥`` (parallel)."""
    words = {}
    for nodes in boxes(stack).values():
        if box_key(nodes[0]) == "fn":
            sub = nodes[0].meta.sublayer or ""
            words[sub] = sublayer_title(nodes, sub).lower()
    return " → ".join(" ∥ ".join(words[s] for s in group)
                      for group in sublayer_ranks(graph, stack))


def norm_kinds(stack: Stack) -> str:
    """'LayerNorm' (or 'RMSNorm', ...) of the norms in a layer, '' when it has none."""
    ops = dict.fromkeys(n.op for n in stack.layer0 if n.category == "norm")
    return " / ".join(op_title(op) for op in ops)


def wiring_text(graph: Graph, stack: Stack) -> str:
    """``LayerNorm, post-norm: norm(x + f(x))`` when every sublayer is wired alike, else the
    layer's assignments (``x = x + self_attn(norm(x)) + ffn(norm(x))``)."""
    kinds = norm_kinds(stack)
    shared = placement(graph, stack)
    text = shared if shared is not None else "; ".join(layer_statements(graph, stack))
    return f"{kinds}, {text}" if kinds else text


def stack_text(graph: Graph, stack: Stack) -> str:
    """The folded stack box: title, sublayer order, heads, feed-forward and wiring."""
    att = next((n for n in stack.layer0 if n.category == "attention"), None)
    ffn = [nodes for nodes in boxes(stack).values()
           if box_key(nodes[0]) == "fn" and attention_of(nodes) is None]
    lines = [f"{stack.name.capitalize()} × {stack.layers}", order_text(graph, stack),
             heads_text(att) if att is not None else "", window_text(graph, stack),
             stack_ffn_text(graph, ffn[0]) if ffn else "",
             wiring_text(graph, stack)]
    return "\n".join(line for line in lines if line)


# ---- embeddings, tables, head ------------------------------------------------------------


def positions_text(graph: Graph, stack: Stack) -> str:
    """How ``stack`` encodes positions: an embedding op, rotary ops in its layers, or none."""
    for node in stack.embed:
        opdef = OPS.get(node.op)
        if opdef is None or opdef.category != "position" or opdef.diagram_text is None:
            continue  # not a position encoding itself (the ids RoBERTa's positions read)
        text = opdef.diagram_text(node.attrs) if opdef.diagram_text is not None else node.op
        if opdef.score_bias:  # T5: a bias on the scores, not an added embedding
            return text
        if len(node.inputs) > 1:  # a learned table
            rows, cols = graph.node(node.inputs[1]).attrs["shape"]
            text += f" ({count(rows)} × {cols})"
        if node.attrs.get("offset"):  # OPT, BART: position p reads row p + 2
            text += f", from row {node.attrs['offset']}"
        if len(node.inputs) > 2:  # the ids it reads: RoBERTa's count the real tokens
            ids = DIAGRAM_OPS.get(graph.node(node.inputs[2]).op)
            text += ids.ids_note if ids is not None else ""
        if node.attrs.get("layout") == "split":  # fairseq, Marian
            text += " (sin | cos halves)"
        return text
    # a position op in a layer rotates q and k (rope)
    rotated = {n.meta.layer for n in graph.ops() if n.category == "position"
               and n.meta.stack == stack.name and n.meta.sublayer == "self_attn"}
    if rotated and len(rotated) < stack.layers:  # Cohere2: none on the global layers
        return f"rotary positions (in attention) in {len(rotated)} of {stack.layers} layers"
    if rotated or any(n.category == "position" for n in stack.layer0):
        return "rotary positions (in attention)"
    return "no positions"


def embed_text(graph: Graph, stack: Stack) -> str:
    """Token gather, scaling and positions of ``stack``'s embedding, from its ops."""
    several = len(stacks(graph)) > 1
    lines = [f"{stack.name.capitalize()} embedding" if several else "Embedding"]
    lines.append(next((line(n) for n in stack.embed
                       if (line := row(n).token_line) is not None), "tokens"))
    for node in stack.embed[1:]:
        if node.category == "embedding":  # another gathered table: BERT's segments
            rows, _ = graph.node(node.inputs[0]).attrs["shape"]
            lines.append(f"+ {name(node.meta.role or node.name).replace('_', ' ')} "
                         f"({count(rows)} rows)")
    lines.append(positions_text(graph, stack))
    for node in stack.embed:
        if node.category == "norm":  # on the sum (BERT, BART)
            lines.append(f"then {op_title(node.op)}")
    return "\n".join(lines)


def table_text(graph: Graph, table: Node) -> str:
    """A token table: its name and shape, and who else reads it (stacks, the head)."""
    rows, cols = table.attrs["shape"]
    readers = [u for u, _ in graph.users(table.name)]
    gathered = {u.meta.stack for u in readers if u.category == "embedding"}
    lines = [name(table.name), f"{count(rows)} × {count(cols)}"]
    if len(gathered) > 1:
        lines.append("shared by both stacks" if len(gathered) == 2
                     else f"shared by {len(gathered)} stacks")
    if any(u.meta.part == "head" for u in readers):
        lines.append("tied to the output head")
    return "\n".join(lines)


def cross_text(graph: Graph, src: Node, stack: Stack) -> str:
    """Edge label of another stack's output read by ``stack``'s layers: ``cross-attention K,
    V`` and whether every layer reads it."""
    readers = users_in(graph, src, stack.name)
    layer0 = [u for u in readers if u.meta.layer == 0]
    box = box_id(layer0[0]) if layer0 else None
    title = sublayer_title(boxes(stack)[box], layer0[0].meta.sublayer or "").lower() \
        if box is not None else ""
    what = " ".join(w for w in (title, ", ".join(r.upper() for r in roles(layer0))) if w)
    layers = {u.meta.layer for u in readers}
    into = f"into every {stack.name} layer (× {stack.layers})" if len(layers) == stack.layers \
        else f"into {len(layers)} of {stack.layers} {stack.name} layers"
    return f"{what}\n{into}"

