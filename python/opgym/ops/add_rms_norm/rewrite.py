"""The fused forward of a verified layer form: HF's own statements, with the residual add and the RMSNorm
of the sum replaced by one call (and, across layers, the last add and the first norm), nothing else.

A form (forms.FORMS) is admitted by the fingerprint of the class's forward (guard.fingerprint: the AST
without docstring, annotations and decorators); this module rewrites that very AST. The rewrites, on
the forward's top-level statements (T, S, U: names; a, b: any expressions, the add's operands; N: a
norm attribute the form names):

  inner add + norm (the form's `fuse`):
    T = a + b; S = T; T = self.N(T)        ->  T, S = _opgym_add_norm(a, b)
      (Llama's `hidden_states = residual + hidden_states; residual = hidden_states; hidden_states =
      self.post_attention_layernorm(hidden_states)`; a may be `h * self.residual_multiplier`)
    T = a + b; U = self.N(T)               ->  U, T = _opgym_add_norm(a, b)
      (the normed sum under another name; with U == T the sum is not kept: T, _opgym_sum = ...)
    T = a + b; T = T + f(self.N(T))        ->  _opgym_normed, T = _opgym_add_norm(a, b)
                                               T = T + f(_opgym_normed)
      (a vision block's `h = h + attn(norm1(h))` then `h = h + mlp(norm2(h))`)

  chain out (`chain_out`: the layer's last add, fused with the next layer's input norm):
    T = a + b; return T (or a tuple of T)  ->  T = _opgym_chain_out(a, b); return ...

  chain in (`chain_in` = N: the norm of the layer's first argument X, the first thing done to X):
    (first statement)                      ->  _opgym_normed_in = _opgym_take(X)
    ... self.N(X) ...                      ->  ... (_opgym_normed_in if _opgym_normed_in is not None
                                                    else self.N(X)) ...

`_opgym_add_norm(a, b)` returns (norm(a + b), a + b): the fused op, or HF's own `a + b` and the norm
module where the op does not serve the call. The operands stay in HF's order, so they are evaluated as
HF evaluates them. The helpers come in as parameters after `self`, so the function holds no state:
it is compiled once per (forward, chain_in, chain_out) with the HF module's globals and HF's defaults;
each layer calls it with its own helpers. `fused_source(cls, form)` shows the text.

The rewriter also checks what the form data says: it finds exactly the `fuse` norms after an add, the
`chain_in` norm only as a call on the untouched first argument, the chained add last; a form whose
AST does not have these shapes raises (a table entry that does not match its code is a bug).
"""
from __future__ import annotations

import ast
import inspect
import linecache
import textwrap
import types

from ...guard import fingerprint

HELPERS = ("_opgym_add_norm", "_opgym_take", "_opgym_chain_out")
_NORMED, _NORMED_IN, _SUM = "_opgym_normed", "_opgym_normed_in", "_opgym_sum"


class FormMismatch(ValueError):
    """A form's data does not describe its forward's AST."""


def _name(node, ctx=ast.Load):
    return ast.Name(id=node if isinstance(node, str) else node.id, ctx=ctx())


def _is_name(node, name: str | None = None) -> bool:
    return isinstance(node, ast.Name) and (name is None or node.id == name)


def _self_call(node, attr: str | None = None) -> str | None:
    """N when node is `self.N(<one positional arg>)`."""
    if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and _is_name(node.func.value, "self")
            and len(node.args) == 1 and not node.keywords and (attr is None or node.func.attr == attr)):
        return node.func.attr
    return None


def _add(stmt):
    """(T, a, b) when stmt is `T = a + b`; else None."""
    if (isinstance(stmt, ast.Assign) and len(stmt.targets) == 1 and _is_name(stmt.targets[0])
            and isinstance(stmt.value, ast.BinOp) and isinstance(stmt.value.op, ast.Add)):
        return stmt.targets[0].id, stmt.value.left, stmt.value.right
    return None


def _assign(stmt):
    """(target name, value) of a single-name assignment."""
    if isinstance(stmt, ast.Assign) and len(stmt.targets) == 1 and _is_name(stmt.targets[0]):
        return stmt.targets[0].id, stmt.value
    return None


def _calls_of(tree, attr: str) -> list:
    return [n for n in ast.walk(tree) if isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute)
            and _is_name(n.func.value, "self") and n.func.attr == attr]


def _stores(tree, name: str) -> bool:
    return any(isinstance(n, ast.Name) and n.id == name and isinstance(n.ctx, (ast.Store, ast.Del))
               for n in ast.walk(tree))


def _helper_call(helper: str, a, b):
    """helper(a, b): the operands in HF's order, so they are evaluated in HF's order."""
    return ast.Call(func=_name(helper), args=[a, b], keywords=[])


def _targets(*names):
    return [ast.Tuple(elts=[_name(n, ast.Store) for n in names], ctx=ast.Store())]


def _fuse_inner(body: list, fuse: str) -> list:
    """body with the `fuse` norm of a residual sum fused with the add (the shapes in the module docstring)."""
    out, found, i = [], [], 0

    def norm_of(value, t):  # `self.N(T)` with N in fuse
        return _self_call(value) == fuse and _is_name(value.args[0], t)

    while i < len(body):
        add = _add(body[i])
        nxt = _assign(body[i + 1]) if add is not None and i + 1 < len(body) else None
        if nxt is not None:
            t, a, b = add
            third = _assign(body[i + 2]) if i + 2 < len(body) else None
            # T = a + b; S = T; T = self.N(T)  ->  T, S = add_norm(a, b)
            if _is_name(nxt[1], t) and nxt[0] != t and third and third[0] == t and norm_of(third[1], t):
                found.append(third[1].func.attr)
                out.append(ast.Assign(targets=_targets(t, nxt[0]), value=_helper_call(HELPERS[0], a, b)))
                i += 3
                continue
            # T = a + b; U = self.N(T)  ->  U, T = add_norm(a, b)   (U == T: the sum is not kept)
            if norm_of(nxt[1], t):
                found.append(nxt[1].func.attr)
                out.append(ast.Assign(targets=_targets(nxt[0], t if nxt[0] != t else _SUM),
                                      value=_helper_call(HELPERS[0], a, b)))
                i += 2
                continue
            # T = a + b; T = T + f(self.N(T))  ->  normed, T = add_norm(a, b); T = T + f(normed)
            if (nxt[0] == t and isinstance(nxt[1], ast.BinOp) and isinstance(nxt[1].op, ast.Add)
                    and _is_name(nxt[1].left, t)):
                calls = [c for c in ast.walk(nxt[1].right) if isinstance(c, ast.Call) and norm_of(c, t)]
                uses = [n for n in ast.walk(nxt[1].right) if _is_name(n, t)]
                if len(calls) == 1 and len(uses) == 1:
                    found.append(calls[0].func.attr)
                    out.append(ast.Assign(targets=_targets(_NORMED, t), value=_helper_call(HELPERS[0], a, b)))
                    out.append(_Replace(calls[0], _name(_NORMED)).visit(body[i + 1]))
                    i += 2
                    continue
        out.append(body[i])
        i += 1
    if found != [fuse]:
        raise FormMismatch(f"norms of a residual sum found: {found}; the form says {fuse!r}")
    return out


class _Replace(ast.NodeTransformer):
    def __init__(self, old, new):
        self.old, self.new = old, new

    def visit(self, node):
        if node is self.old:
            return self.new
        return super().visit(node)


def _chain_out(body: list) -> list:
    ret, add = body[-1], _add(body[-2]) if len(body) >= 2 else None
    if add is None or not isinstance(ret, ast.Return):
        raise FormMismatch("chain_out: the forward does not end with `T = a + b; return T`")
    t, a, b = add
    val = ret.value
    if not (_is_name(val, t) or (isinstance(val, ast.Tuple) and any(_is_name(e, t) for e in val.elts))):
        raise FormMismatch("chain_out: the forward does not return the sum")
    return body[:-2] + [ast.Assign(targets=[_name(t, ast.Store)], value=_helper_call(HELPERS[2], a, b)), ret]


def _chain_in(body: list, norm: str, x: str) -> list:
    """The input norm of the first argument x, taken from the previous layer's stash when it is there."""
    holders = [i for i, s in enumerate(body) if _calls_of(s, norm)]
    if len(holders) != 1:
        raise FormMismatch(f"chain_in: self.{norm} is called in {len(holders)} top-level statements, not 1")
    i = holders[0]
    if any(_stores(s, x) for s in body[:i]):
        raise FormMismatch(f"chain_in: {x} is reassigned before self.{norm}({x})")
    stmt = body[i]
    # the call(s) must be each path's first evaluation of x: the value of an assignment, or the first
    # statement of each branch of an if/else whose test reads no norm
    blocks = [[stmt]]
    if isinstance(stmt, ast.If):
        blocks, node = [], stmt
        while True:
            blocks.append(node.body)
            if len(node.orelse) == 1 and isinstance(node.orelse[0], ast.If):
                node = node.orelse[0]
                continue
            if node.orelse:
                blocks.append(node.orelse)
            break
    for block in blocks:
        first, rest = block[0], block[1:]
        if isinstance(first, ast.If) or any(_calls_of(s, norm) for s in rest):
            raise FormMismatch(f"chain_in: self.{norm} is not the first statement of its branch")
        calls = _calls_of(first, norm)
        if len(calls) > 1 or (calls and not (_self_call(calls[0], norm) and _is_name(calls[0].args[0], x))):
            raise FormMismatch(f"chain_in: self.{norm} is not called once on {x}")
    for call in _calls_of(stmt, norm):
        guard = ast.Compare(left=_name(_NORMED_IN), ops=[ast.IsNot()], comparators=[ast.Constant(None)])
        stmt = _Replace(call, ast.IfExp(test=guard, body=_name(_NORMED_IN), orelse=call)).visit(stmt)
    take = ast.Assign(targets=[_name(_NORMED_IN, ast.Store)],
                      value=ast.Call(func=_name(HELPERS[1]), args=[_name(x)], keywords=[]))
    return [take] + body[:i] + [stmt] + body[i + 1:]


def _function_def(fn) -> ast.FunctionDef:
    node = ast.parse(textwrap.dedent(inspect.getsource(fn))).body[0]
    if not isinstance(node, ast.FunctionDef):
        raise FormMismatch("not a function definition")
    body = node.body
    if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
        body = body[1:]
    node.body, node.decorator_list, node.returns = body, [], None
    args = node.args
    for a in args.posonlyargs + args.args + args.kwonlyargs + [args.vararg, args.kwarg]:
        if a is not None:
            a.annotation = None
    return node


def rewrite(fn, form, chain_in: bool, chain_out: bool) -> ast.FunctionDef:
    """The rewritten FunctionDef of fn (an HF layer forward, unwrapped) for `form`."""
    node = _function_def(fn)
    if node.args.posonlyargs or len(node.args.args) < 2 or node.args.args[0].arg != "self":
        raise FormMismatch("the forward's first parameters are not (self, hidden_states, ...)")
    x = node.args.args[1].arg
    if any(_stores(s, h) for s in node.body for h in HELPERS + (_NORMED, _NORMED_IN, _SUM)):
        raise FormMismatch("the forward already uses a name opgym's rewrite needs")
    body = _fuse_inner(node.body, form.fuse)
    if chain_out:
        body = _chain_out(body)
    if chain_in:
        body = _chain_in(body, form.chain_in, x)
    node.body = body
    node.args.args[1:1] = [ast.arg(arg=h) for h in HELPERS]
    return ast.fix_missing_locations(node)


_COMPILED: dict = {}


def compile_forward(cls: type, form, chain_in: bool, chain_out: bool):
    """The fused forward of cls as a function (self, add_norm, take, chain_out, <HF's parameters>),
    compiled once per (forward, chain_in, chain_out); it holds no state."""
    fn = inspect.unwrap(cls.forward)
    key = (fn.__code__, form, chain_in, chain_out)
    hit = _COMPILED.get(key)
    if hit is not None:
        return hit
    if fn.__code__.co_freevars:
        raise FormMismatch(f"the forward has free variables {fn.__code__.co_freevars} (a closure or super())")
    if fingerprint(fn) != form.fingerprint:
        raise FormMismatch("the forward is not the form's")
    src = ast.unparse(rewrite(fn, form, chain_in, chain_out)) + "\n"
    filename = f"<opgym add_rms_norm: {cls.__module__}.{cls.__qualname__}.forward{' chain-in' * chain_in}" \
               f"{' chain-out' * chain_out}>"
    linecache.cache[filename] = (len(src), None, src.splitlines(True), filename)  # tracebacks show the fused text
    module = compile(src, filename, "exec")
    code = next(c for c in module.co_consts if isinstance(c, types.CodeType))
    out = types.FunctionType(code, fn.__globals__, fn.__name__, fn.__defaults__)
    out.__kwdefaults__ = fn.__kwdefaults__
    out.__qualname__ = f"{cls.__qualname__}.forward"
    out.__doc__ = f"opgym add_rms_norm: {cls.__qualname__}.forward with the residual add and norm fused\n\n{src}"
    _COMPILED[key] = out
    return out


def fused_source(cls: type, form, chain_in: bool = True, chain_out: bool = True) -> str:
    """The text of the fused forward (for review and tests)."""
    return ast.unparse(rewrite(inspect.unwrap(cls.forward), form, chain_in, chain_out))
