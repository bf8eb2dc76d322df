"""The layer contract: ``layers_below()`` names what a layer wraps; ``find_layer`` walks it."""

from __future__ import annotations

import pytest

from llm_resilience.layers import (
    Layer,
    Probeable,
    WrapsOne,
    find_layer,
    layers_below,
    leaves,
    read_through,
    refuse_shadowing_write,
)


class Provider:
    def __init__(self, name: str) -> None:
        self.name = name


class Wrapper:
    def __init__(self, inner: object) -> None:
        self.inner = inner

    def layers_below(self) -> tuple[object, ...]:
        return (self.inner,)


class Chain:
    def __init__(self, *members: object) -> None:
        self.members = members

    def layers_below(self) -> tuple[object, ...]:
        return self.members


class Marked(Wrapper):
    pass


def test_every_layer_of_a_stack_is_found_depth_first_itself_included() -> None:
    primary, secondary, spare = Provider("a"), Provider("b"), Provider("c")
    nested = Chain(Marked(secondary), spare)
    top = Wrapper(Chain(primary, nested))
    assert isinstance(top, Layer)
    assert find_layer(top, Wrapper) is top
    assert find_layer(top, Chain) is top.inner
    assert find_layer(top, Marked) is nested.members[0]
    assert find_layer(top, Provider) is primary
    assert find_layer(top, int) is None
    assert leaves(top) == [primary, secondary, spare]


def test_a_wrapper_of_your_own_is_read_through_its_inner_attribute() -> None:
    class Yours:
        def __init__(self, inner: object) -> None:
            self.inner = inner

    provider = Provider("a")
    assert find_layer(Yours(Wrapper(provider)), Provider) is provider
    assert layers_below(Yours([provider, provider])) == (provider, provider)


def test_no_other_attribute_name_is_taken_for_a_layer() -> None:
    class Holder:
        models = [Provider("a")]
        llms = [Provider("b")]

    assert layers_below(Holder()) == ()
    assert find_layer(Holder(), Provider) is None


def test_a_layer_whose_attributes_fail_to_read_wraps_nothing() -> None:
    class HalfBuilt:
        @property
        def inner(self) -> object:
            raise AttributeError("not set yet")

    assert layers_below(HalfBuilt()) == ()
    assert leaves(HalfBuilt())[0].__class__ is HalfBuilt


def test_a_stack_that_loops_back_on_itself_ends() -> None:
    chain = Chain()
    chain.members = (Wrapper(chain),)
    assert find_layer(chain, Provider) is None


def test_a_core_fallback_chain_answers_its_clients_as_the_layers_below_it() -> None:
    from llm_resilience.fallback import FallbackChain

    chain = FallbackChain(["primary", "secondary"])
    assert layers_below(chain) == ("primary", "secondary")
    assert leaves(chain) == ["primary", "secondary"]


def test_a_wrapper_over_one_inner_names_it_below_and_probes_through_it() -> None:
    class OneInner(WrapsOne):
        def __init__(self, inner: object) -> None:
            self.inner = inner

    provider = "provider"
    outer = OneInner(OneInner(provider))
    assert outer.layers_below() == (outer.inner,)
    assert outer.find_layer(OneInner) is outer
    assert outer.find_layer(str) == provider
    assert outer.find_layer(int) is None


def test_a_probeable_layer_finds_through_the_members_it_names() -> None:
    class Chain(Probeable):
        def layers_below(self) -> tuple[object, ...]:
            return (1.5, "member")

    assert Chain().find_layer(str) == "member"
    assert Chain().find_layer(float) == 1.5


class Store:
    collection_name = "docs"

    def __init__(self) -> None:
        self.client = object()

    def search(self) -> str:
        return "unretried"

    @classmethod
    def build(cls) -> Store:
        return cls()


class Reading:
    """A wrapper over one store that reads through it, refusing its methods."""

    #: Declared, so the wrapper's own even before it is set.
    policy: object

    def __init__(self, inner: Store) -> None:
        self.inner = inner
        self.policy = "own"

    @property
    def broken(self) -> str:
        raise AttributeError("broken")

    def __getattr__(self, name: str) -> object:
        return read_through(
            self, name, self.__dict__.get("inner"), role="store", methods_refused="not retried"
        )

    def __setattr__(self, name: str, value: object) -> None:
        refuse_shadowing_write(self, name, self.__dict__.get("inner"), role="store")
        super().__setattr__(name, value)


def test_reads_go_below_but_never_private_names_class_names_or_methods() -> None:
    inner = Store()
    layer = Reading(inner)

    assert (layer.collection_name, layer.client) == ("docs", inner.client)
    for name in ("_secret", "__wrapped__", "broken"):
        with pytest.raises(AttributeError, match=f"'Reading' object has no attribute '{name}'"):
            getattr(layer, name)
    for method in ("search", "build"):
        with pytest.raises(AttributeError, match=rf"method '{method}': not retried; \.inner"):
            getattr(layer, method)
    with pytest.raises(AttributeError, match=r"nor has its store \(Store\)"):
        layer.missing  # noqa: B018


def test_a_layer_not_yet_built_reads_nothing_below() -> None:
    layer = Reading.__new__(Reading)

    with pytest.raises(AttributeError, match="'Reading' object has no attribute 'inner'"):
        layer.inner  # noqa: B018
    with pytest.raises(AttributeError, match=r"no attribute 'collection_name'$"):
        layer.collection_name  # noqa: B018


def test_a_write_never_goes_below_and_one_that_would_hide_a_value_below_is_refused() -> None:
    inner = Store()
    inner.policy = "the store's"  # type: ignore[attr-defined]
    layer = Reading(inner)  # its declared ``policy`` is its own to set

    with pytest.raises(AttributeError, match=r"set client on \.inner instead"):
        layer.client = None
    layer.policy = "changed"
    layer.note = "new"  # a name below lacks lands on the layer

    assert (inner.client is not None, inner.policy) == (True, "the store's")  # type: ignore[attr-defined]
    assert (layer.policy, layer.note) == ("changed", "new")
    assert not hasattr(inner, "note")
