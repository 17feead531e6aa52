"""The load generator: how many frames one learner process can take, serve and train on.

``python -m benchmarks.loadgen`` (``make loadgen``) starts the real learner (or the echo
server) and drives it with S synthetic actors of K envs each
(:mod:`benchmarks.loadgen.synthetic`): real ``Act`` streams on ``grpc.aio`` channels in
one process, Hello and frames of the env's exact layout (the newest frame only where
the learner takes frames once), episode ends as the env really ends them, but no env
stepped: frames recorded once are replayed, so the generator costs the host little and
the learner's limit shows. Per mode (:mod:`benchmarks.loadgen.measure`) it reports the
learner process's CPU per frame (the headline: it holds up when generator and learner
share cores), frames/s answered and trained, round-trip p50/p99, and with
``--time-phases`` where that CPU goes (decode, batch assembly, forward, trajectory write,
trainer hand-off, reply, and the event loop and threads around them). Results go to a
JSON (``seedrl-loadgen/1``) and, by ``python -m benchmarks.loadgen table``, to
docs/performance.md.
"""
