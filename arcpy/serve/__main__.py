"""python -m arcpy.serve: the OpenAI-compatible HTTP server."""

from arcpy.serve.command import main

main()
