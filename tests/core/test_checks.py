"""A constructor refuses a keyword it does not take, naming the closest it does.

``KnownKeywords`` is what every wrapper of both adapters inherits: the check runs before
the class's own ``__init__``, over the keywords its ``__init__``s, pydantic fields and
``accepted_keywords`` take.
"""

from __future__ import annotations

import copy
import pickle
from typing import Any, TypedDict, Unpack

import pytest
from pydantic import BaseModel, Field

from llm_resilience.checks import KnownKeywords, keywords_taken, known_keywords


class Options(TypedDict, total=False):
    requests_per_minute: int
    max_queued_requests: int


class Plain(KnownKeywords):
    def __init__(self, *, inner: object, budget: object, **options: Unpack[Options]) -> None:
        self.inner, self.budget, self.options = inner, budget, options


class Model(BaseModel, KnownKeywords):
    inner: Any = None
    scope: str | None = Field(default=None, alias="budget_scope")

    def __init__(self, *, policy: object = None, **data: Any) -> None:
        super().__init__(**data)


class Standard(Model):
    accepted_keywords = ("temperature",)


def test_the_keywords_taken_are_the_inits_the_typed_options_the_fields_and_the_accepted() -> None:
    assert keywords_taken(Plain) == (
        "inner",
        "budget",
        "requests_per_minute",
        "max_queued_requests",
    )
    assert set(keywords_taken(Standard)) == {
        "policy",
        "inner",
        "scope",
        "budget_scope",
        "temperature",
    }


@pytest.mark.parametrize(
    ("build", "message"),
    [
        (
            lambda: Plain(inner=1, budget=2, requests_per_minut=3),
            "Plain takes no keyword 'requests_per_minut'; did you mean 'requests_per_minute'?",
        ),
        (lambda: Model(scoep="t"), "Model takes no keyword 'scoep'; did you mean 'scope'?"),
        (lambda: Model(polcy=None), "Model takes no keyword 'polcy'; did you mean 'policy'?"),
        (
            lambda: Standard(temprature=0),
            "Standard takes no keyword 'temprature'; did you mean 'temperature'?",
        ),
        (lambda: Model(zzz=1), "Model takes no keyword 'zzz' (it takes policy, inner, scope"),
    ],
)
def test_an_unknown_keyword_is_refused_naming_the_closest(build: Any, message: str) -> None:
    with pytest.raises(TypeError) as raised:
        build()
    assert str(raised.value).startswith(message)


def test_a_misspelled_required_option_is_named_before_the_init_finds_it_missing() -> None:
    with pytest.raises(TypeError, match="no keyword 'budgt'; did you mean 'budget'"):
        Plain(inner=1, budgt=2)  # type: ignore[call-arg]


def test_what_is_taken_still_builds_and_copies_and_pickles_skip_the_check() -> None:
    plain = Plain(inner=1, budget=2, requests_per_minute=3)
    model = Standard(inner=1, budget_scope="t", temperature=0.5, policy=None)

    assert (plain.options, model.scope) == ({"requests_per_minute": 3}, "t")
    assert copy.copy(plain).options == plain.options
    assert pickle.loads(pickle.dumps(model)).scope == "t"
    assert Standard.model_construct(inner=2).inner == 2


def test_known_keywords_lists_what_it_takes_when_nothing_is_close() -> None:
    with pytest.raises(TypeError, match=r"takes no keyword 'x' \(it takes a, b\)"):
        known_keywords("f", ["x"], ["a", "b"])
