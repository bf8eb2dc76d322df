"""The layer contract: ``layers_below()`` names what a layer wraps; ``find_layer`` walks it."""

from __future__ import annotations

from llm_resilience.layers import Layer, Probeable, WrapsOne, find_layer, layers_below, leaves


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
