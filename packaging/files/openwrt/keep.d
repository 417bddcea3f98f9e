/etc/qinglong-edge/
