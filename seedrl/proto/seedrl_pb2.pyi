from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class Tensor(_message.Message):
    __slots__ = ("dtype", "shape", "data")
    DTYPE_FIELD_NUMBER: _ClassVar[int]
    SHAPE_FIELD_NUMBER: _ClassVar[int]
    DATA_FIELD_NUMBER: _ClassVar[int]
    dtype: str
    shape: _containers.RepeatedScalarFieldContainer[int]
    data: bytes
    def __init__(self, dtype: _Optional[str] = ..., shape: _Optional[_Iterable[int]] = ..., data: _Optional[bytes] = ...) -> None: ...

class SpaceSpec(_message.Message):
    __slots__ = ("kind", "shape", "dtype", "n", "low", "high", "children", "name", "nvec")
    KIND_FIELD_NUMBER: _ClassVar[int]
    SHAPE_FIELD_NUMBER: _ClassVar[int]
    DTYPE_FIELD_NUMBER: _ClassVar[int]
    N_FIELD_NUMBER: _ClassVar[int]
    LOW_FIELD_NUMBER: _ClassVar[int]
    HIGH_FIELD_NUMBER: _ClassVar[int]
    CHILDREN_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    NVEC_FIELD_NUMBER: _ClassVar[int]
    kind: str
    shape: _containers.RepeatedScalarFieldContainer[int]
    dtype: str
    n: int
    low: Tensor
    high: Tensor
    children: _containers.RepeatedCompositeFieldContainer[SpaceSpec]
    name: str
    nvec: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, kind: _Optional[str] = ..., shape: _Optional[_Iterable[int]] = ..., dtype: _Optional[str] = ..., n: _Optional[int] = ..., low: _Optional[_Union[Tensor, _Mapping]] = ..., high: _Optional[_Union[Tensor, _Mapping]] = ..., children: _Optional[_Iterable[_Union[SpaceSpec, _Mapping]]] = ..., name: _Optional[str] = ..., nvec: _Optional[_Iterable[int]] = ...) -> None: ...

class EnvSpec(_message.Message):
    __slots__ = ("env_id", "env_kwargs_json", "observation_space", "action_space", "agents")
    ENV_ID_FIELD_NUMBER: _ClassVar[int]
    ENV_KWARGS_JSON_FIELD_NUMBER: _ClassVar[int]
    OBSERVATION_SPACE_FIELD_NUMBER: _ClassVar[int]
    ACTION_SPACE_FIELD_NUMBER: _ClassVar[int]
    AGENTS_FIELD_NUMBER: _ClassVar[int]
    env_id: str
    env_kwargs_json: str
    observation_space: SpaceSpec
    action_space: SpaceSpec
    agents: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, env_id: _Optional[str] = ..., env_kwargs_json: _Optional[str] = ..., observation_space: _Optional[_Union[SpaceSpec, _Mapping]] = ..., action_space: _Optional[_Union[SpaceSpec, _Mapping]] = ..., agents: _Optional[_Iterable[str]] = ...) -> None: ...

class Hello(_message.Message):
    __slots__ = ("protocol_version", "actor_id", "run_id", "num_envs", "env", "frame_stack")
    PROTOCOL_VERSION_FIELD_NUMBER: _ClassVar[int]
    ACTOR_ID_FIELD_NUMBER: _ClassVar[int]
    RUN_ID_FIELD_NUMBER: _ClassVar[int]
    NUM_ENVS_FIELD_NUMBER: _ClassVar[int]
    ENV_FIELD_NUMBER: _ClassVar[int]
    FRAME_STACK_FIELD_NUMBER: _ClassVar[int]
    protocol_version: int
    actor_id: str
    run_id: str
    num_envs: int
    env: EnvSpec
    frame_stack: int
    def __init__(self, protocol_version: _Optional[int] = ..., actor_id: _Optional[str] = ..., run_id: _Optional[str] = ..., num_envs: _Optional[int] = ..., env: _Optional[_Union[EnvSpec, _Mapping]] = ..., frame_stack: _Optional[int] = ...) -> None: ...

class Frame(_message.Message):
    __slots__ = ("observations", "rewards", "terminated", "truncated", "observation_leaves", "acting")
    OBSERVATIONS_FIELD_NUMBER: _ClassVar[int]
    REWARDS_FIELD_NUMBER: _ClassVar[int]
    TERMINATED_FIELD_NUMBER: _ClassVar[int]
    TRUNCATED_FIELD_NUMBER: _ClassVar[int]
    OBSERVATION_LEAVES_FIELD_NUMBER: _ClassVar[int]
    ACTING_FIELD_NUMBER: _ClassVar[int]
    observations: Tensor
    rewards: Tensor
    terminated: Tensor
    truncated: Tensor
    observation_leaves: _containers.RepeatedCompositeFieldContainer[Tensor]
    acting: Tensor
    def __init__(self, observations: _Optional[_Union[Tensor, _Mapping]] = ..., rewards: _Optional[_Union[Tensor, _Mapping]] = ..., terminated: _Optional[_Union[Tensor, _Mapping]] = ..., truncated: _Optional[_Union[Tensor, _Mapping]] = ..., observation_leaves: _Optional[_Iterable[_Union[Tensor, _Mapping]]] = ..., acting: _Optional[_Union[Tensor, _Mapping]] = ...) -> None: ...

class ActorMessage(_message.Message):
    __slots__ = ("hello", "frame")
    HELLO_FIELD_NUMBER: _ClassVar[int]
    FRAME_FIELD_NUMBER: _ClassVar[int]
    hello: Hello
    frame: Frame
    def __init__(self, hello: _Optional[_Union[Hello, _Mapping]] = ..., frame: _Optional[_Union[Frame, _Mapping]] = ...) -> None: ...

class Accept(_message.Message):
    __slots__ = ("learner_run_id",)
    LEARNER_RUN_ID_FIELD_NUMBER: _ClassVar[int]
    learner_run_id: str
    def __init__(self, learner_run_id: _Optional[str] = ...) -> None: ...

class Actions(_message.Message):
    __slots__ = ("actions", "action_leaves")
    ACTIONS_FIELD_NUMBER: _ClassVar[int]
    ACTION_LEAVES_FIELD_NUMBER: _ClassVar[int]
    actions: Tensor
    action_leaves: _containers.RepeatedCompositeFieldContainer[Tensor]
    def __init__(self, actions: _Optional[_Union[Tensor, _Mapping]] = ..., action_leaves: _Optional[_Iterable[_Union[Tensor, _Mapping]]] = ...) -> None: ...

class Shutdown(_message.Message):
    __slots__ = ("reason", "final")
    REASON_FIELD_NUMBER: _ClassVar[int]
    FINAL_FIELD_NUMBER: _ClassVar[int]
    reason: str
    final: bool
    def __init__(self, reason: _Optional[str] = ..., final: _Optional[bool] = ...) -> None: ...

class LearnerMessage(_message.Message):
    __slots__ = ("accept", "actions", "shutdown")
    ACCEPT_FIELD_NUMBER: _ClassVar[int]
    ACTIONS_FIELD_NUMBER: _ClassVar[int]
    SHUTDOWN_FIELD_NUMBER: _ClassVar[int]
    accept: Accept
    actions: Actions
    shutdown: Shutdown
    def __init__(self, accept: _Optional[_Union[Accept, _Mapping]] = ..., actions: _Optional[_Union[Actions, _Mapping]] = ..., shutdown: _Optional[_Union[Shutdown, _Mapping]] = ...) -> None: ...

class GetInfoRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class LearnerInfo(_message.Message):
    __slots__ = ("protocol_version", "env", "learner_run_id", "max_message_bytes", "rank_addresses", "local_address", "frame_stack", "envs_per_actor")
    PROTOCOL_VERSION_FIELD_NUMBER: _ClassVar[int]
    ENV_FIELD_NUMBER: _ClassVar[int]
    LEARNER_RUN_ID_FIELD_NUMBER: _ClassVar[int]
    MAX_MESSAGE_BYTES_FIELD_NUMBER: _ClassVar[int]
    RANK_ADDRESSES_FIELD_NUMBER: _ClassVar[int]
    LOCAL_ADDRESS_FIELD_NUMBER: _ClassVar[int]
    FRAME_STACK_FIELD_NUMBER: _ClassVar[int]
    ENVS_PER_ACTOR_FIELD_NUMBER: _ClassVar[int]
    protocol_version: int
    env: EnvSpec
    learner_run_id: str
    max_message_bytes: int
    rank_addresses: _containers.RepeatedScalarFieldContainer[str]
    local_address: str
    frame_stack: int
    envs_per_actor: int
    def __init__(self, protocol_version: _Optional[int] = ..., env: _Optional[_Union[EnvSpec, _Mapping]] = ..., learner_run_id: _Optional[str] = ..., max_message_bytes: _Optional[int] = ..., rank_addresses: _Optional[_Iterable[str]] = ..., local_address: _Optional[str] = ..., frame_stack: _Optional[int] = ..., envs_per_actor: _Optional[int] = ...) -> None: ...
