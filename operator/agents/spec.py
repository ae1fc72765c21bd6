"""``Agent.spec`` and ``AgentModel.spec`` as pydantic models, and an AgentModel as the
``ModelConfig`` a run is admitted with.

What belongs here: the shapes of both specs and their defaults (the model's window and output
allowance come from ``kernel.Limits``), and ``model_config``, the one place an AgentModel
becomes a ``ModelConfig`` (prices come only from here, never from a run). What does not:
resolving a run's ``spec.agentRef`` (``resolve``), reading the objects (``store``,
``models``).
"""

from __future__ import annotations

from collections.abc import Mapping
from decimal import Decimal
from typing import Any
from urllib.parse import urlsplit

from pydantic import Field, field_validator, model_validator

from agentrun import kernel
from agentrun.protocol import ModelConfig, SecretRef

from ..platform.spec import USD, SpecModel, parse

KERNEL_DEFAULTS = kernel.Limits()
"""Where the model's window and output allowance default from."""
BASE_URL_CREDENTIALS = (
    "must not carry credentials (user:password@ before the host): every tenant can read an"
    " AgentModel; put the key in the Secret that spec.credentials.secretRef names"
)
"""Why an AgentModel's ``baseURL`` with credentials is refused (the CRD says the same)."""


class ParameterSpec(SpecModel):
    """One of ``Agent.spec.parameters``."""

    name: str
    description: str = ""
    default: str | None = None
    required: bool = False


class AgentSpec(SpecModel):
    """``Agent.spec``: the fields a run of the Agent takes (as written: ``agents`` copies them
    into the run's resolved spec: ``resolve``) and the parameters it declares. Parse with
    ``AgentSpec.of``."""

    model: str = ""
    instructions: str | None = None
    tools: tuple[str, ...] = ()
    parameters: tuple[ParameterSpec, ...] = ()

    @classmethod
    def of(cls, name: str, spec: Mapping[str, Any] | None) -> AgentSpec:
        """Parse Agent ``name``'s spec; raises ``SpecError`` naming the Agent and field."""
        return parse(cls, spec, where=f"Agent {name!r} spec")


class PricingSpec(SpecModel):
    """``AgentModel.spec.pricing``: USD per one million tokens."""

    input_per_million: USD = Field(default=Decimal(0), alias="inputPerMillionUSD")
    cached_input_per_million: USD | None = Field(default=None, alias="cachedInputPerMillionUSD")
    """Unset: the input price (cached tokens are never free by omission)."""
    output_per_million: USD = Field(default=Decimal(0), alias="outputPerMillionUSD")
    free: bool = False
    """``pricing.free: true``: the model's calls cost nothing, said on purpose."""

    @model_validator(mode="after")
    def _cached_not_dearer(self) -> PricingSpec:
        """A cached prompt token never costs more than an uncached one: a call's hold prices
        its prompt at the input price, so a dearer cached price would let a cached prompt
        cost past what was held (a provider's cache-write premium is not this price)."""
        cached = self.cached_input_per_million
        if cached is not None and cached > self.input_per_million:
            raise ValueError(
                f"cachedInputPerMillionUSD {cached} is above inputPerMillionUSD "
                f"{self.input_per_million}: a cached prompt token is never dearer"
            )
        return self

    @property
    def cached_input(self) -> Decimal:
        """The price of cached prompt tokens: ``cachedInputPerMillionUSD``, or the input
        price when it is unset."""
        if self.cached_input_per_million is None:
            return self.input_per_million
        return self.cached_input_per_million

    @property
    def unpriced(self) -> tuple[str, ...]:
        """The prices a cost budget cannot do without that are "0" on a model not declared
        free: ``inputPerMillionUSD`` (prompts would cost nothing) and ``outputPerMillionUSD``
        (replies would, however long a provider ignoring ``max_tokens`` made them), by field
        name; empty when both are set or the model is free. A cached-input price of "0" is a
        choice (a provider whose cache is free)."""
        if self.free:
            return ()
        prices = {
            "inputPerMillionUSD": self.input_per_million,
            "outputPerMillionUSD": self.output_per_million,
        }
        return tuple(field for field, price in prices.items() if not price)

    def unpriced_text(self) -> str:
        """What ``unpriced`` lacks, for a message: ``no prices`` (neither is set) or
        ``no pricing.<field>`` (one is "0")."""
        missing = self.unpriced
        return "no prices" if len(missing) > 1 else f"no pricing.{''.join(missing)}"


class SecretRefSpec(SpecModel):
    """``AgentModel.spec.credentials.secretRef``."""

    name: str
    namespace: str
    key: str = "apiKey"


class CredentialsSpec(SpecModel):
    """``AgentModel.spec.credentials``."""

    secret_ref: SecretRefSpec | None = Field(default=None, alias="secretRef")


class AgentModelSpec(SpecModel):
    """``AgentModel.spec``. Parse with ``AgentModelSpec.of``."""

    base_url: str = Field(default="", alias="baseURL")
    model: str = ""
    pricing: PricingSpec = Field(default_factory=PricingSpec)
    context_window: int = Field(default=KERNEL_DEFAULTS.context_window, alias="contextWindow")
    max_output_tokens: int = Field(
        default=KERNEL_DEFAULTS.max_output_tokens, alias="maxOutputTokens"
    )
    credentials: CredentialsSpec = Field(default_factory=CredentialsSpec)

    @field_validator("base_url")
    @classmethod
    def _no_credentials(cls, base_url: str) -> str:
        """No user or password before the host (``https://user:key@host/v1``): every tenant
        may read an AgentModel (and its runs' admitted events), so a credential there is
        everyone's. The key belongs in ``credentials.secretRef``. The message does not
        repeat the URL."""
        if "@" in urlsplit(base_url).netloc:
            raise ValueError(BASE_URL_CREDENTIALS)
        return base_url

    @classmethod
    def of(cls, name: str, spec: Mapping[str, Any] | None) -> AgentModelSpec:
        """Parse AgentModel ``name``'s spec; raises ``SpecError`` naming the model and field."""
        return parse(cls, spec, where=f"AgentModel {name!r} spec")


def model_config(name: str, model: Mapping[str, Any]) -> ModelConfig:
    """The AgentModel object (as a dict) as a ``ModelConfig``; raises ``SpecError`` naming
    the model and the field. The one place an AgentModel becomes a ``ModelConfig``."""
    spec = AgentModelSpec.of(name, model.get("spec"))
    pricing = spec.pricing
    secret = spec.credentials.secret_ref
    return ModelConfig(
        name=name,
        base_url=spec.base_url,
        model=spec.model,
        pricing=kernel.Pricing(
            pricing.input_per_million,
            pricing.cached_input,
            pricing.output_per_million,
        ),
        context_window=spec.context_window,
        max_output_tokens=spec.max_output_tokens,
        secret=SecretRef(secret.name, secret.namespace, secret.key) if secret else None,
    )
