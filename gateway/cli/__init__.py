"""The ``ledge`` command (``main``: ``run``, ``check-config``, ``version``) and one module
per subcommand that is more than a few lines (``bridge``, ``status``, ``ble``,
``passwd``, ``firewall``).

Everything here runs in the short-lived command process: ``ledge run`` validates the
config and then execs into the gateway process (``gateway.app``), leaving this
package, and the validator it loads, behind. Nothing outside ``gateway.cli`` imports
it.
"""
