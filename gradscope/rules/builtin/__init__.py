"""Built-in rules; importing this package registers them."""

from gradscope.rules.builtin import (
    attention,  # noqa: F401
    basic,  # noqa: F401
    excitation,  # noqa: F401
    experts,  # noqa: F401
    lrp,  # noqa: F401
    relu_family,  # noqa: F401
    substitute,  # noqa: F401
    transformer,  # noqa: F401
    values,  # noqa: F401
)
