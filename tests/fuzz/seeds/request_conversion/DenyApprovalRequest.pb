
$6f1c2a4e-8b1d-4c3e-9f7a-2b5d8e0c1a93wrong customer