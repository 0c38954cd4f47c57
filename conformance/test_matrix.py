"""The conformance matrix: one test per case, its id the case id (``-k`` selects by id).

The cases come from the options (``--profile``, ``--case-file``, ``--shard``); the plugin
(conformance/plugin.py) parametrizes ``conformance_case`` and provides the runner.
"""


def test_case(conformance_case, conformance_runner, request):
    conformance_runner.check(conformance_case, request.node.user_properties)
