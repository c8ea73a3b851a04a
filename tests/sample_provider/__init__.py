"""A provider plug-in that exists only in the tests: ``sample``, an SMS provider with a
settings section, a client, an emulator, a receipt route and a development environment,
registered in a copy of the
registry (:class:`SampleSettings`) to show that everything that enumerates providers picks a
plug-in up from its registry entry alone."""
