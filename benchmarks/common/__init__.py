"""What the benchmarks share: their command lines, result files, report tables and plots.

- :mod:`.cli`: the load average, the checkout's commit, ``--cells`` / ``--rounds`` checks and
  the output folder;
- :mod:`.files`: atomic writes, JSON / CSV of dataclass rows and reading them back;
- :mod:`.report`: number formats, the targets table;
- :mod:`.rows`: the fields every loop benchmark's row starts with;
- :mod:`.plot`: time against memory, one panel per problem, points labelled
  (:mod:`.labels`);
- :mod:`.ratios`: a time ratio taken within each round, the median over rounds.

No framework is imported here: ``--replot`` redraws from a JSON file alone.
"""
