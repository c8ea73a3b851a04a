"""Provider plug-ins: one package per provider, named like its settings section.

A plug-in's package holds its settings section and registry entry (``config``), its client,
classification table, receipts and signature check, its emulator (``notiflow fakes``) and,
when the provider posts delivery receipts, the API's routes for them; its ``__init__``
exposes the :class:`~notiflow.adapters.providers.base.ProviderSpec` as ``SPEC``.
:mod:`notiflow.providers.registry` is the one list of plug-ins.
"""

import notiflow.settings  # noqa: F401  (first: the settings object imports the registry)
