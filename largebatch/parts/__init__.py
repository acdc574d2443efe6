"""The parts a run is made of, each built from its config section: one module per thing built.

``largebatch.run`` calls these in order; each takes the typed config (choices as plain strings)
and the facts of the run so far, hands plain values to the library and returns a named type, so
nothing below reads the config object. Modules:

* ``data``: the data folder and this rank's loaders, from one ``LoaderSpec``;
* ``model``: the timm model, its wrapping for training (DDP, ``torch.compile``) and the shapes
  it is compiled for;
* ``training``: optimizer, lr schedule, weight EMA, how the loop runs a step;
* ``diagnostics``: the gradient noise scale and the adaptive batch that reads it;
* ``hooks``: the loop's hooks in their order;
* ``record``: the run directory, what the run resolved (summary.json, checkpoints) and its
  start-up lines;
* ``resume``: the checkpoint a run continues from, checked against the run and loaded;
* ``outcome``: how a run ends (out of memory, a stop by signal) in the run's terms.

The schedules the config and the run share (batch per epoch, side per epoch) are built in the
ground (``largebatch.batch_schedule.batch_schedule_of``, ``largebatch.resolution.resolution_of``),
where the config checks can call the same builder.
"""
