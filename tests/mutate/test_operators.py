"""The mutation operators on small sources: each makes exactly the text expected, and none touches a comment,
a string, a preprocessor line, a dropped #ifdef branch or an entry's signature."""

import pytest

from csa_conform.device.kernels import KernelDirectory
from csa_conform.mutate.mutants import mutants_of, mutants_of_text, sample
from csa_conform.mutate.operators import OPERATORS
from csa_conform.mutate.tokens import (
    COMMENT,
    PREPROCESSOR,
    STRING,
    all_tokens,
    inactive_spans,
    signature_spans,
    tokenize,
)

STRICT = ("--fmad=false",)


def mutated(text: str, operator: str, options=STRICT) -> list[str]:
    return [mutant.apply(text) for mutant in mutants_of_text("k.cu", text, (operator,), options)]


@pytest.mark.parametrize("operator, text, expected", [
    ("relational", "if (a < b) x = 1;", ["if (a <= b) x = 1;"]),
    ("relational", "y = a >= b && c != d;", ["y = a > b && c != d;", "y = a >= b && c == d;"]),
    ("arithmetic", "y = a + b * c;", ["y = a - b * c;", "y = a + b / c;"]),
    ("arithmetic", "s += -t;", ["s -= -t;"]),
    ("constant", "x = 0x7fu + 0;", ["x = 0x80u + 0;", "x = 0x7eu + 0;", "x = 0x7fu + 1;"]),
    ("constant", "float f = 1.5f; int n = 64;", ["float f = 1.5f; int n = 65;", "float f = 1.5f; int n = 63;"]),
    ("logical", "if (!p && q) r = 1;", ["if (p && q) r = 1;", "if (!p || q) r = 1;"]),
    ("statement", "for (;;) { if (a) continue; x = 2; ++n; break; }",
     ["for (;;) { if (a) ; x = 2; ++n; break; }", "for (;;) { if (a) continue; ; ++n; break; }",
      "for (;;) { if (a) continue; x = 2; ; break; }", "for (;;) { if (a) continue; x = 2; ++n; ; }"]),
    ("barrier-delete", "{ a = 1; __syncthreads(); b = a; }", ["{ a = 1; ; b = a; }"]),
    ("barrier-move", "{ s[t] = 1; __syncthreads(); b = s[u]; }",
     ["{ __syncthreads(); s[t] = 1; b = s[u]; }", "{ s[t] = 1; b = s[u]; __syncthreads(); }"]),
    ("barrier-move", "{ float m = 0.0f; __syncthreads(); k |= 1 << m; s[t] = m; }", []),
    ("barrier-move", "{ __shared__ float top; __syncthreads(); m = top; }", ["{ __shared__ float top; m = top; __syncthreads(); }"]),
    ("index-swap", "int i = threadIdx.x + blockIdx.x;", ["int i = blockIdx.x + blockIdx.x;",
                                                         "int i = threadIdx.x + threadIdx.x;"]),
    ("min-max", "m = fmaxf(m, fminf(a, b));", ["m = fminf(m, fminf(a, b));", "m = fmaxf(m, fmaxf(a, b));"]),
    ("ceil-floor", "e = (int)ceilf(v);", ["e = (int)floorf(v);"]),
    ("neg-inf-init", "float m = -INFINITY; float z = CSA_NEG_INF; w = 1.0f;",
     ["float m = 0.0f; float z = CSA_NEG_INF; w = 1.0f;", "float m = -INFINITY; float z = 0.0f; w = 1.0f;"]),
    ("truncation", "c = rintf(v * 2.0f); h = csa_round_bf16(x);",
     ["c = truncf(v * 2.0f); h = csa_round_bf16(x);",
      "c = rintf(v * 2.0f); h = __uint_as_float(__float_as_uint(x) & 0xffff0000u);"]),
    ("loop-bound", "for (int i = 0; i < n * 2; ++i) s += i;",
     ["for (int i = 0; i < (n * 2) + 1; ++i) s += i;", "for (int i = 0; i < (n * 2) - 1; ++i) s += i;"]),
    ("index-offset", "float* p = base + (long long)b * stride + i; q = v[(h * heads + k) * d];",
     ["float* p = base + i; q = v[(h * heads + k) * d];", "float* p = base + (long long)b * stride + i; q = v[(k) * d];"]),
])
def test_operator_makes_the_expected_text(operator, text, expected):
    assert mutated(text, operator) == expected


def test_contraction_only_where_the_build_contracts():
    text = "acc = acc + __fmul_rn(p, v[d]);"
    assert mutated(text, "contraction", STRICT) == []  # --fmad=false: the plain product rounds the same
    assert mutated(text, "contraction", ()) == ["acc = acc + (p) * (v[d]);"]


def test_declarators_templates_and_unary_minus_are_not_operators():
    text = "template <typename T> __device__ void f(const float* p, T t) { float* q = p; x = -y; z = *p; }"
    assert mutated(text, "arithmetic") == []
    assert mutated(text, "relational") == []


def test_nothing_inside_comments_strings_preprocessor_lines_or_signatures():
    text = ('#define LIMIT (a < b ? 1 : 2)\n'
            '/* if (a < b) x = x + 1; */\n'
            'extern "C" __global__ void entry(const float* in, float* out, int n)\n'
            '{\n'
            '    // n < 4 - 1\n'
            '    const char* s = "a < b + 1";\n'
            '    out[0] = in[0] + 1;\n'
            '}\n')
    mutants = mutants_of_text("k.cu", text, tuple(OPERATORS), STRICT)
    assert {mutant.line for mutant in mutants} == {7}
    assert sorted({mutant.original for mutant in mutants}) == ["+", "0", "1", "out[0] = in[0] + 1;"]


def test_dropped_preprocessor_branches_are_not_mutated():
    text = "#ifdef FAST\nx = a + b;\n#else\ny = a - b;\n#endif\n"
    assert [mutant.line for mutant in mutants_of_text("k.cu", text, ("arithmetic",), STRICT)] == [4]
    assert [mutant.line for mutant in mutants_of_text("k.cu", text, ("arithmetic",), ("-DFAST",))] == [2]
    spans = inactive_spans(text, frozenset())
    assert [text[start:end].strip() for start, end in spans] == ["x = a + b;"]


def test_tokens_keep_multi_character_operators_whole():
    assert [token.text for token in tokenize("a <<= b >> 2; p->q <= r;")] == \
        ["a", "<<=", "b", ">>", "2", ";", "p", "->", "q", "<=", "r", ";"]


def test_ids_are_stable_and_distinct_and_the_sample_is_stratified():
    mutants, texts = mutants_of(KernelDirectory())
    again, _ = mutants_of(KernelDirectory())
    assert [mutant.id for mutant in mutants] == [mutant.id for mutant in again]
    assert len({mutant.id for mutant in mutants}) == len(mutants)
    drawn = sample(mutants, 60, seed=3)
    assert len(drawn) == 60 and drawn == sample(mutants, 60, seed=3) and drawn != sample(mutants, 60, seed=4)
    per_operator = {}
    for mutant in drawn:
        per_operator[mutant.operator] = per_operator.get(mutant.operator, 0) + 1
    # every operator with mutants gets its share (4 or 5 of 60 over 14 operators), the rare ones all they have
    available = {mutant.operator: 0 for mutant in mutants}
    for mutant in mutants:
        available[mutant.operator] += 1
    assert all(per_operator.get(operator, 0) >= min(count, 4) for operator, count in available.items())


def test_every_builtin_mutant_changes_code_only():
    """The built-in kernels' mutants: none in a comment, a literal, a preprocessor line or an entry signature."""
    mutants, texts = mutants_of(KernelDirectory())
    for name, text in texts.items():
        tokens = all_tokens(text)
        closed = [(token.start, token.end) for token in tokens if token.kind in (COMMENT, STRING, PREPROCESSOR)]
        closed += signature_spans(tokenize(text))
        for mutant in (mutant for mutant in mutants if mutant.file == name):
            # a moved barrier carries the comment beside it along, unchanged; nothing else touches one
            touched = [text[start:end] for start, end in closed if start < mutant.end and mutant.start < end]
            assert all(piece in mutant.replacement for piece in touched), mutant.id
            assert not touched or mutant.operator == "barrier-move", mutant.id
