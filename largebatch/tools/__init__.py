"""The command-line tools that prepare a data set (console scripts of ``setup.py``).

* ``largebatch-make-synthetic`` (``make_synthetic``): the embedded set, :mod:`largebatch.data.synthetic`;
* ``largebatch-check-data`` (``check_data``): the DALI file lists, :mod:`largebatch.data.check`;
* ``largebatch-make-shards`` (``make_shards``): WebDataset shards, :mod:`largebatch.data.shards`.

Each ``main(argv=None)`` returns its exit code; bad flags or input are one line on stderr and
exit 2 (:class:`largebatch.tools.args.OneLineArgumentParser`). ``python -m
largebatch.tools.<module>`` runs a tool without the console script.
"""
