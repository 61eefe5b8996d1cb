"""The families by name and the suites as lists of families: which recipes a suite generates, in order."""

from __future__ import annotations

import fnmatch

from csa_conform.errors import FixtureError, UsageError
from csa_conform.golden.recipes import boundaries, closed_form, edges, long_context, quant_edge, randomized, rejections
from csa_conform.golden.recipes.stream import Recipe

FAMILIES = {
    closed_form.FAMILY: closed_form.recipes,
    randomized.FAMILY: randomized.recipes,
    boundaries.FAMILY: boundaries.recipes,
    quant_edge.FAMILY: quant_edge.recipes,
    rejections.FAMILY: rejections.recipes,
    edges.FAMILY: edges.recipes,
    long_context.FAMILY: long_context.recipes,
}

SUITES = {
    "ci": tuple(family for family in FAMILIES if family != long_context.FAMILY),
    "full": tuple(FAMILIES),
    "prod": (randomized.FAMILY,),
    "long": (long_context.FAMILY,),
    "bench": (long_context.FAMILY,),
}


def suite_recipes(suite: str, seed: int = 0, case_glob: str | None = None) -> list[Recipe]:
    """The suite's recipes sorted by case id (the order goldens are written in)."""
    if suite not in SUITES:
        raise UsageError(f"unknown suite {suite!r}; choose one of {', '.join(SUITES)}")
    recipes = [recipe for family in SUITES[suite] for recipe in FAMILIES[family](suite, seed)]
    ids = [recipe.case_id for recipe in recipes]
    if len(set(ids)) != len(ids):
        raise FixtureError(f"suite {suite!r} names a case twice")
    if case_glob is not None:
        recipes = [recipe for recipe in recipes if fnmatch.fnmatchcase(recipe.case_id, case_glob)]
        if not recipes:
            raise UsageError(f"no case of suite {suite!r} matches {case_glob!r}")
    return sorted(recipes, key=lambda recipe: recipe.case_id)
