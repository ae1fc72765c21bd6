"""Zero trust in message contents: the operator seals what it admits, every process checks.

Anyone holding a NATS credential that may append run events (a worker's, by design) could
write an ``admitted`` event or a reviewer's ``approval``. So the operator signs both with an
Ed25519 key only it holds (mounted from a Secret), and a process acts on a run's config — its
model URL and Secret, namespace, tenant, URL rules, MCP endpoints and header Secrets, every
field — only once the seal verifies with a key it trusts. What is sealed, byte for byte, is
``agentrun.protocol.sealed``'s.

- ``keys``: the signing and trust files (key ids, rotation, retirement), pure;
- ``seal``: ``Signer``, ``Verifier`` and the refusal vocabulary (``SealFault``, ``Untrusted``);
- ``files``: the files as a running process reads them, again when they change;
- ``secrets``: the files kept in Kubernetes Secrets (``agentrun signing bootstrap|rotate|
  retire``).
"""

from agentrun.trust.files import KeyFile, signing_file, trust_file
from agentrun.trust.keys import (
    ACTIVATION_DELAY,
    KeyFileError,
    NoSigningKey,
    SigningKey,
    SigningKeys,
    TrustedKeys,
    key_id,
)
from agentrun.trust.seal import SealFault, Signer, Untrusted, Verifier, refusal

__all__ = [
    "ACTIVATION_DELAY",
    "KeyFile",
    "KeyFileError",
    "NoSigningKey",
    "SealFault",
    "Signer",
    "SigningKey",
    "SigningKeys",
    "TrustedKeys",
    "Untrusted",
    "Verifier",
    "key_id",
    "refusal",
    "signing_file",
    "trust_file",
]
