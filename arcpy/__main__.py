"""`python -m arcpy`: the arcpy CLI."""

from arcpy.cli import main

main(prog_name="arcpy")
