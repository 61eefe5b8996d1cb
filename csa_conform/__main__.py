from csa_conform.cli import main

main()
