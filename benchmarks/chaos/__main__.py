from benchmarks.chaos.run import main

main()
