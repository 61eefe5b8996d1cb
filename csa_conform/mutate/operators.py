"""The mutation operators: each finds the places in one source where it applies and the one change it makes.

An operator is a function of a ``Source`` (the file's text, its code tokens
and what they are) yielding ``Change``s: a span of the text and what replaces
it. The classic operators change one token (a relational or arithmetic
operator, an integer constant by one, a logical operator) or delete one
statement (``continue;``, ``break;``, an assignment); the CUDA and numeric
ones are the bugs a kernel port makes: a barrier deleted or moved past its
neighbour, ``threadIdx`` for ``blockIdx``, an explicitly rounded product made
contractible, ``fmaxf``/``fminf`` and ``ceilf``/``floorf`` swapped, a ``-inf``
initialiser made 0, a round-to-nearest helper made a truncation, a loop bound
moved by one and an index that lost its batch or head offset. No change
touches a comment, a literal string, a preprocessor line, a branch the
preprocessor drops or an entry's parameter list.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Iterator

from csa_conform.mutate.tokens import IDENTIFIER, NUMBER, Token, integer_value, matching

TYPE_WORDS = frozenset("""void bool char short int long float double unsigned signed const volatile auto size_t
    uint8_t uint16_t uint32_t uint64_t int8_t int16_t int32_t int64_t __half __nv_bfloat16 dim3 float2 float4
    int2 int4 uint2 uint4 static inline __device__ __host__ __forceinline__ __shared__ __constant__ constexpr
    extern typename struct class template""".split())
KEYWORDS = frozenset("return if else for while do switch case default sizeof break continue goto new delete".split())
CONTROL = frozenset("if else for while do switch return case default".split())

RELATIONAL = {"<": "<=", "<=": "<", ">": ">=", ">=": ">", "==": "!=", "!=": "=="}
ARITHMETIC = {"+": "-", "-": "+", "*": "/", "/": "*", "+=": "-=", "-=": "+=", "*=": "/=", "/=": "*="}
LOGICAL = {"&&": "||", "||": "&&"}
ASSIGNMENTS = frozenset("= += -= *= /= %= &= |= ^= <<= >>=".split())
SWAPPED_INDEX = {"threadIdx": "blockIdx", "blockIdx": "threadIdx"}
MIN_MAX = {"fmaxf": "fminf", "fminf": "fmaxf", "fmax": "fmin", "fmin": "fmax", "max": "min", "min": "max"}
CEIL_FLOOR = {"ceilf": "floorf", "floorf": "ceilf", "ceil": "floor", "floor": "ceil"}
# explicitly rounded binary32/binary64 operations -> the C operator NVRTC may contract
ROUNDED_OPERATIONS = {"__fmul_rn": "*", "__fadd_rn": "+", "__fsub_rn": "-", "__fdiv_rn": "/",
                      "__dmul_rn": "*", "__dadd_rn": "+", "__dsub_rn": "-", "__ddiv_rn": "/",
                      "csa_mul": "*", "csa_dmul": "*"}
# round-to-nearest helpers -> truncation of the same value: the libm's, CUDA's conversions, and the
# prelude's bf16 rounding (its truncation keeps the top 16 bits of the binary32 pattern)
TRUNCATIONS = {
    "rintf": "truncf({0})", "roundf": "truncf({0})", "nearbyintf": "truncf({0})",
    "rint": "trunc({0})", "round": "trunc({0})", "nearbyint": "trunc({0})",
    "__float2int_rn": "__float2int_rz({0})", "__float2uint_rn": "__float2uint_rz({0})",
    "__float2ll_rn": "__float2ll_rz({0})", "__double2float_rn": "__double2float_rz({0})",
    "csa_round_bf16_bits": "((unsigned short)(__float_as_uint({0}) >> 16))",
    "csa_round_bf16": "__uint_as_float(__float_as_uint({0}) & 0xffff0000u)",
}
NEG_INF = ("CSA_NEG_INF", "-INFINITY", "-HUGE_VALF", "-CUDART_INF_F", "-inf", "-std::numeric_limits<float>::infinity()")
# The names by which an index expression adds its batch row or head: b * stride, (long long)h * stride.
OFFSET_NAMES = frozenset({"b", "h", "head", "batch_index", "head_index", "bi", "hi"})
LOOP_RELATIONS = frozenset({"<", "<=", ">", ">=", "!="})
# Calls that read no memory: a statement of locals and these does nothing another thread sees.
PURE_CALLS = frozenset("""min max sqrtf sqrt fabsf fabs fmaxf fminf fmax fmin floorf ceilf truncf rintf roundf
    expf exp2f logf log2f sinf cosf powf __float_as_uint __uint_as_float __float_as_int __int_as_float
    __double_as_longlong __longlong_as_double __fmul_rn __fadd_rn __dmul_rn __dadd_rn""".split())


@dataclass(frozen=True)
class Change:
    """One mutation of a source: the text at ``start:end`` becomes ``replacement``."""

    operator: str
    start: int
    end: int
    replacement: str


@dataclass
class Source:
    """One source file as the operators see it: its text, code tokens (what a mutant may touch) and the
    type names it declares (so ``float* p`` is a declarator, ``a * b`` a product)."""

    text: str
    tokens: list[Token]
    contracts: bool  # whether the build may contract a*b+c (NVRTC's --fmad=true)

    def __post_init__(self) -> None:
        self.types = set(TYPE_WORDS)
        for index, token in enumerate(self.tokens[:-1]):
            if token.text in ("struct", "class", "typename") and self.tokens[index + 1].kind == IDENTIFIER:
                self.types.add(self.tokens[index + 1].text)
        self.shared = {self.tokens[at].text for at in range(len(self.tokens) - 1)
                       if self.tokens[at].kind == IDENTIFIER and self.tokens[at + 1].text in (";", "[", "=")
                       and "__shared__" in (token.text for token in self.tokens[max(0, at - 4):at])}
        self.template = self._template_brackets()
        self.depth = self._paren_depths()

    def _template_brackets(self) -> set[int]:
        """Indices of the angle brackets of ``template <...>``: not comparisons."""
        found: set[int] = set()
        for index, token in enumerate(self.tokens[:-1]):
            if token.text == "template" and self.tokens[index + 1].text == "<":
                level = 0
                for at in range(index + 1, len(self.tokens)):
                    level += {"<": 1, ">": -1}.get(self.tokens[at].text, 0)
                    if self.tokens[at].text in "<>":
                        found.add(at)
                    if level == 0:
                        break
        return found

    def _paren_depths(self) -> list[int]:
        """Each token's parenthesis depth inside its innermost brace (a lambda's body starts again at 0)."""
        depths, stack, depth = [], [], 0
        for token in self.tokens:
            if token.text == "{":
                stack.append(depth)
                depth = 0
            elif token.text == "}" and stack:
                depth = stack.pop()
            elif token.text in "([":
                depth += 1
            elif token.text in ")]":
                depth -= 1
            depths.append(depth)
        return depths

    def binary(self, index: int) -> bool:
        """Whether the operator token at ``index`` has a left operand (so it is not unary, a declarator or
        a template bracket)."""
        if index == 0 or index in self.template:
            return False
        before = self.tokens[index - 1]
        if before.kind == NUMBER or before.text in (")", "]"):
            return True
        return before.kind == IDENTIFIER and before.text not in self.types and before.text not in KEYWORDS

    def call(self, index: int) -> tuple[int, list[tuple[int, int]]] | None:
        """For a function name at ``index`` used as a call (not declared or defined there): the index of its
        closing parenthesis and its arguments as token index ranges."""
        tokens = self.tokens
        if index + 1 >= len(tokens) or tokens[index + 1].text != "(":
            return None
        if index > 0 and (tokens[index - 1].text in self.types or tokens[index - 1].text in (".", "->", "::")
                          or tokens[index - 1].text == "*"):
            return None
        close = matching(tokens, index + 1)
        arguments, start, level = [], index + 2, 0
        for at in range(index + 2, close):
            level += {"(": 1, "[": 1, "{": 1, ")": -1, "]": -1, "}": -1}.get(tokens[at].text, 0)
            if tokens[at].text == "," and level == 0:
                arguments.append((start, at))
                start = at + 1
        if start < close:
            arguments.append((start, close))
        return close, arguments

    def span_text(self, first: int, last: int) -> str:
        """The text of tokens first..last (inclusive) as written."""
        return self.text[self.tokens[first].start:self.tokens[last].end]

    def statement_starts(self) -> Iterator[int]:
        """Indices of tokens that begin a statement of a block (outside every parenthesis)."""
        for index, token in enumerate(self.tokens):
            if self.depth[index] != 0 or token.text in ("{", "}", ";"):
                continue
            before = self.tokens[index - 1].text if index else "{"
            if before in (";", "{", "}", "else") or (before == ")" and self._closes_condition(index - 1)):
                yield index

    def _closes_condition(self, index: int) -> bool:
        """Whether the ``)`` at ``index`` closes an if/for/while condition."""
        level = 0
        for at in range(index, -1, -1):
            level += {")": 1, "(": -1}.get(self.tokens[at].text, 0)
            if level == 0:
                return at > 0 and self.tokens[at - 1].text in ("if", "for", "while")
        return False

    def statement_end(self, start: int) -> int | None:
        """The ``;`` that ends the simple statement at ``start`` (None when it holds a brace: a block or an
        initializer list, or when it is a control statement)."""
        if self.tokens[start].text in CONTROL:
            return None
        for at in range(start, len(self.tokens)):
            if self.tokens[at].text in ("{", "}"):
                return None
            if self.tokens[at].text == ";" and self.depth[at] == 0:
                return at
        return None

    def declaration(self, start: int) -> bool:
        tokens = self.tokens
        if tokens[start].text in self.types:
            return True
        following = tokens[start + 1] if start + 1 < len(tokens) else None
        return tokens[start].kind == IDENTIFIER and following is not None and following.kind == IDENTIFIER


Operator = Callable[[Source], Iterator[Change]]


def _replace(operator: str, token: Token, replacement: str) -> Change:
    return Change(operator, token.start, token.end, replacement)


def relational(source: Source) -> Iterator[Change]:
    for index, token in enumerate(source.tokens):
        if token.text in RELATIONAL and (token.text in ("==", "!=", "<=", ">=") or source.binary(index)):
            if index not in source.template:
                yield _replace("relational", token, RELATIONAL[token.text])


def arithmetic(source: Source) -> Iterator[Change]:
    for index, token in enumerate(source.tokens):
        if token.text in ARITHMETIC and (token.text.endswith("=") or source.binary(index)):
            yield _replace("arithmetic", token, ARITHMETIC[token.text])


def _integer(value: int, prefix: str, suffix: str) -> str:
    return f"{prefix}{value:x}{suffix}" if prefix else f"{value}{suffix}"


def constant(source: Source) -> Iterator[Change]:
    for token in source.tokens:
        parsed = integer_value(token.text) if token.kind == NUMBER else None
        if parsed is None:
            continue
        value, prefix, suffix = parsed
        yield _replace("constant", token, _integer(value + 1, prefix, suffix))
        if value > 0:
            yield _replace("constant", token, _integer(value - 1, prefix, suffix))


def logical(source: Source) -> Iterator[Change]:
    for index, token in enumerate(source.tokens):
        if token.text in LOGICAL:
            yield _replace("logical", token, LOGICAL[token.text])
        elif token.text == "!" and not source.binary(index):
            yield _replace("logical", token, "")


def statement(source: Source) -> Iterator[Change]:
    """A ``continue;``, ``break;`` or assignment / increment statement replaced by an empty statement."""
    tokens = source.tokens
    for start in source.statement_starts():
        if tokens[start].text in ("continue", "break") and start + 1 < len(tokens) and tokens[start + 1].text == ";":
            yield Change("statement", tokens[start].start, tokens[start + 1].end, ";")
            continue
        end = source.statement_end(start)
        if end is None or source.declaration(start) or tokens[start].text in KEYWORDS:
            continue
        words = [tokens[at].text for at in range(start, end) if source.depth[at] == 0]
        if any(word in ASSIGNMENTS for word in words) or words[:1] in (["++"], ["--"]) or words[-1:] in (["++"], ["--"]):
            yield Change("statement", tokens[start].start, tokens[end].end, ";")


def _barriers(source: Source) -> Iterator[int]:
    tokens = source.tokens
    for start in source.statement_starts():
        if (tokens[start].text == "__syncthreads" and start + 3 < len(tokens)
                and [token.text for token in tokens[start + 1:start + 4]] == ["(", ")", ";"]):
            yield start


def barrier_delete(source: Source) -> Iterator[Change]:
    for start in _barriers(source):
        yield Change("barrier-delete", source.tokens[start].start, source.tokens[start + 3].end, ";")


def _touches_memory(source: Source, start: int, end: int) -> bool:
    """Whether a statement can read or write what other threads see: an element through ``[]`` or ``->``, a
    ``__shared__`` variable or a call. Moving a barrier past one on locals only (``int span = 1;``,
    ``mask |= 255u << shift;``) changes nothing: an equivalent mutant by construction."""
    tokens = source.tokens
    if "__shared__" in (tokens[at].text for at in range(start, end)):
        return False  # a declaration: nothing happens at run time
    for at in range(start, end):
        if tokens[at].text in ("[", "->") or tokens[at].text in source.shared:
            return True
        if tokens[at].kind == IDENTIFIER and at + 1 < end and tokens[at + 1].text == "(" \
                and tokens[at].text not in source.types and tokens[at].text not in PURE_CALLS:
            return True
    return False


def barrier_move(source: Source) -> Iterator[Change]:
    """The barrier swapped with the simple statement after it, and with the one before it, where that
    statement can touch memory another thread sees."""
    tokens, text = source.tokens, source.text
    starts = set(source.statement_starts())
    for start in _barriers(source):
        barrier = text[tokens[start].start:tokens[start + 3].end]
        after = start + 4
        if after < len(tokens) and after in starts and tokens[after].text not in ("}", "else"):
            end = source.statement_end(after)
            if end is not None and tokens[after].text not in KEYWORDS and _touches_memory(source, after, end):
                between = text[tokens[start + 3].end:tokens[after].start]
                yield Change("barrier-move", tokens[start].start, tokens[end].end,
                             source.span_text(after, end) + between + barrier)
        if start > 0 and tokens[start - 1].text == ";":
            first = max((index for index in starts if index < start - 1), default=None)
            if (first is None or source.statement_end(first) != start - 1 or tokens[first].text in KEYWORDS
                    or not _touches_memory(source, first, start - 1)):
                continue
            if first > 0 and tokens[first - 1].text in (")", "else"):
                continue  # the body of an if/for/while: moving the barrier would change what it controls
            between = text[tokens[start - 1].end:tokens[start].start]
            yield Change("barrier-move", tokens[first].start, tokens[start + 3].end,
                         barrier + between + source.span_text(first, start - 1))


def index_swap(source: Source) -> Iterator[Change]:
    for token in source.tokens:
        if token.text in SWAPPED_INDEX:
            yield _replace("index-swap", token, SWAPPED_INDEX[token.text])


def _renamed_calls(source: Source, operator: str, names: dict[str, str]) -> Iterator[Change]:
    for index, token in enumerate(source.tokens):
        if token.text in names and source.call(index) is not None:
            yield _replace(operator, token, names[token.text])


def min_max(source: Source) -> Iterator[Change]:
    yield from _renamed_calls(source, "min-max", MIN_MAX)


def ceil_floor(source: Source) -> Iterator[Change]:
    yield from _renamed_calls(source, "ceil-floor", CEIL_FLOOR)


def contraction(source: Source) -> Iterator[Change]:
    """``__fmul_rn(a, b)`` -> ``(a) * (b)`` (and the other explicitly rounded operations): only where the
    build contracts (--fmad=true), since under --fmad=false the plain operation rounds the same and the
    mutant would be equivalent by construction."""
    if not source.contracts:
        return
    for index, token in enumerate(source.tokens):
        found = source.call(index) if token.text in ROUNDED_OPERATIONS else None
        if found is None or len(found[1]) != 2:
            continue
        close, ((a0, a1), (b0, b1)) = found
        left, right = source.span_text(a0, a1 - 1), source.span_text(b0, b1 - 1)
        yield Change("contraction", token.start, source.tokens[close].end,
                     f"({left}) {ROUNDED_OPERATIONS[token.text]} ({right})")


def neg_inf_init(source: Source) -> Iterator[Change]:
    """A ``-inf`` assigned or initialised (``m = -INFINITY;``, ``float m = CSA_NEG_INF;``) -> ``0.0f``."""
    tokens = source.tokens
    for index, token in enumerate(tokens):
        if token.text != "=":
            continue
        end = index + 1
        while end < len(tokens) and not (tokens[end].text in (";", ",") and source.depth[end] == source.depth[index]):
            end += 1
        if end == index + 1 or end >= len(tokens):
            continue
        value = "".join(tokens[at].text for at in range(index + 1, end))
        if value in NEG_INF:
            yield Change("neg-inf-init", tokens[index + 1].start, tokens[end - 1].end, "0.0f")


def truncation(source: Source) -> Iterator[Change]:
    """A round-to-nearest call -> the truncation of its argument."""
    for index, token in enumerate(source.tokens):
        found = source.call(index) if token.text in TRUNCATIONS else None
        if found is None or len(found[1]) != 1:
            continue
        close, ((first, last),) = found
        argument = source.span_text(first, last - 1)
        yield Change("truncation", token.start, source.tokens[close].end, TRUNCATIONS[token.text].format(argument))


def loop_bound(source: Source) -> Iterator[Change]:
    """The bound of a for loop's condition (``i < n`` -> ``i < n + 1`` and ``i < n - 1``)."""
    tokens = source.tokens
    for index, token in enumerate(tokens[:-1]):
        if token.text != "for" or tokens[index + 1].text != "(":
            continue
        close = matching(tokens, index + 1)
        semicolons = [at for at in range(index + 2, close) if tokens[at].text == ";"
                      and source.depth[at] == source.depth[index + 1]]
        if len(semicolons) != 2:
            continue
        first, last = semicolons[0] + 1, semicolons[1] - 1
        relation = next((at for at in range(first, last + 1) if tokens[at].text in LOOP_RELATIONS
                         and source.depth[at] == source.depth[index + 1] and at not in source.template), None)
        if relation is None or relation == last:
            continue
        bound = source.span_text(relation + 1, last)
        wrapped = bound if relation + 1 == last else f"({bound})"
        for delta in ("+ 1", "- 1"):
            yield Change("loop-bound", tokens[relation + 1].start, tokens[last].end, f"{wrapped} {delta}")


def _operand_start(source: Source, index: int) -> int:
    """The first token of the factor ending at ``index``'s name: a member access ``r.b`` and a leading
    cast ``(long long)`` included."""
    tokens, first = source.tokens, index
    if first >= 2 and tokens[first - 1].text in (".", "->") and tokens[first - 2].kind == IDENTIFIER:
        first -= 2
    if first >= 1 and tokens[first - 1].text == ")":
        opening = first - 1
        while opening > 0 and tokens[opening].text != "(":
            opening -= 1
        if all(tokens[at].text in source.types for at in range(opening + 1, first - 1)) and opening < first - 2:
            first = opening
    return first


def index_offset(source: Source) -> Iterator[Change]:
    """An index expression without its batch or head term: ``base + (long long)b * stride + i`` -> ``base + i``,
    ``(b * sequence + s) * k`` -> ``(s) * k``."""
    tokens = source.tokens
    for index, token in enumerate(tokens[:-1]):
        if token.text not in OFFSET_NAMES or tokens[index + 1].text != "*":
            continue
        if index > 0 and tokens[index - 1].text in (".", "->") and tokens[index - 1 - 1].kind != IDENTIFIER:
            continue
        first = _operand_start(source, index)
        before = tokens[first - 1].text if first else ""
        if before not in ("+", "(", "[", "="):
            continue
        level, last = 0, index
        for at in range(index + 1, len(tokens)):
            text = tokens[at].text
            if level == 0 and (text in (")", "]", ";", ",", "+", "-", "?", ":") or text in RELATIONAL):
                break
            level += {"(": 1, "[": 1, ")": -1, "]": -1}.get(text, 0)
            last = at
        after = tokens[last + 1].text if last + 1 < len(tokens) else ""
        if after == "+":
            yield Change("index-offset", tokens[first].start, tokens[last + 2].start, "")
        elif before == "+" and first >= 2:
            yield Change("index-offset", tokens[first - 2].end, tokens[last].end, "")
        elif before in ("(", "[") and after in (")", "]"):
            yield Change("index-offset", tokens[first].start, tokens[last].end, "0")


OPERATORS: dict[str, Operator] = {
    "relational": relational,
    "arithmetic": arithmetic,
    "constant": constant,
    "logical": logical,
    "statement": statement,
    "barrier-delete": barrier_delete,
    "barrier-move": barrier_move,
    "index-swap": index_swap,
    "contraction": contraction,
    "min-max": min_max,
    "ceil-floor": ceil_floor,
    "neg-inf-init": neg_inf_init,
    "truncation": truncation,
    "loop-bound": loop_bound,
    "index-offset": index_offset,
}
