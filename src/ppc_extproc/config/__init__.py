"""Configuration: strict decoding helpers and the ``EndpointPickerConfig`` loader."""
