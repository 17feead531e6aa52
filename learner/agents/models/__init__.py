"""Policy/value networks and their action distributions (learner side only: imports torch),
in modules by role: :mod:`.heads` (actions from policy parameters), :mod:`.spec` (what a
network is built from), :mod:`.torsos` (observation encoders), :mod:`.actor_critic` (the
network and :func:`build_model`), :mod:`.precision` (device and autocast). Every public
name is here too, so ``from learner.agents.models import X`` reads from one place."""

from __future__ import annotations

from learner.agents.models.actor_critic import (
    ActorCritic,
    CoreState,
    TorsoCore,
    build_model,
    model_spec,
)
from learner.agents.models.heads import (
    LOG_STD_MAX,
    LOG_STD_MIN,
    MASKED_LOGIT,
    ActionHead,
    BernoulliHead,
    CategoricalHead,
    GaussianHead,
    MaskedCategoricalHead,
    MultiCategoricalHead,
    ProductHead,
    action_head,
    gumbel_argmax,
    masked_logits,
)
from learner.agents.models.precision import (
    autocast,
    resolve_device,
    resolve_precision,
)
from learner.agents.models.spec import (
    EMBEDDING_SIZE,
    MAX_EMBEDDED_CHOICES,
    ModelSpec,
    choose_torso,
    has_action_mask,
    leaf_inputs,
)
from learner.agents.models.torsos import (
    ImpalaResNet,
    LeafEncoders,
    NatureCNN,
    ResidualBlock,
    SmallCNN,
    image_encoder,
    init_orthogonal_relu,
    mask_floats,
    mlp,
)
from learner.common.spaces import (
    MIN_IMAGE_SIDE,
    UnsupportedSetup,
    image_layout,
    is_image,
    is_image_leaf,
)

__all__ = [
    "EMBEDDING_SIZE",
    "LOG_STD_MAX",
    "LOG_STD_MIN",
    "MASKED_LOGIT",
    "MAX_EMBEDDED_CHOICES",
    "MIN_IMAGE_SIDE",
    "ActionHead",
    "ActorCritic",
    "BernoulliHead",
    "CategoricalHead",
    "CoreState",
    "GaussianHead",
    "ImpalaResNet",
    "LeafEncoders",
    "MaskedCategoricalHead",
    "ModelSpec",
    "MultiCategoricalHead",
    "NatureCNN",
    "ProductHead",
    "ResidualBlock",
    "SmallCNN",
    "TorsoCore",
    "UnsupportedSetup",
    "action_head",
    "autocast",
    "build_model",
    "choose_torso",
    "gumbel_argmax",
    "has_action_mask",
    "image_encoder",
    "image_layout",
    "init_orthogonal_relu",
    "is_image",
    "is_image_leaf",
    "leaf_inputs",
    "mask_floats",
    "masked_logits",
    "mlp",
    "model_spec",
    "resolve_device",
    "resolve_precision",
]
